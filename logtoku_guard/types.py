"""Typed objects passed between stages: prompt -> generation -> token scores -> response score.

Pure Python (no torch import): these are what a backend returns and what the policy reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Union

from logtoku_guard.errors import ConfigurationError, InvalidPromptError
from logtoku_guard.scoring.quadrants import Quadrant, QuadrantThresholds
from logtoku_guard.scoring.uncertainty import DEFAULT_K, DEFAULT_TOP_N, EvidenceMode, WordScore, mean_of, top_n_mean_of
from logtoku_guard.tools.constraints import Constraint, JsonSchema, ToolCalls

if TYPE_CHECKING:
    import torch

Role = Literal["system", "user", "assistant"]
FinishReason = Literal["stop", "length", "cancelled"]
"""``stop``: end-of-sequence token or a stop string; ``length``: ``max_new_tokens`` reached;
``cancelled``: the consumer closed the stream (or a guard stopped it early)."""


@dataclass(frozen=True)
class ChatMessage:
    """One chat turn."""

    role: Role
    content: str

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant"):
            msg = f"chat message role must be 'system', 'user' or 'assistant', got {self.role!r}"
            raise InvalidPromptError(msg)
        if not isinstance(self.content, str):
            msg = f"chat message content must be a string, got {type(self.content).__name__}: {self.content!r}"
            raise InvalidPromptError(msg)


Prompt = Union[str, Sequence[Union[ChatMessage, Mapping[str, str]]]]  # noqa: UP007 - a runtime alias on 3.10
"""A plain question (sent as one user turn) or a list of chat turns."""


def to_messages(prompt: Prompt, system: str | None = None) -> list[ChatMessage]:
    """Normalise a prompt into chat turns, validating it.

    ``system`` is prepended as a system turn unless the messages already start with one.
    Raises :class:`InvalidPromptError` for an empty prompt, malformed turns, or text that is
    not valid Unicode (a lone surrogate such as ``"\\udce9"``, left by decoding bytes with
    ``errors="surrogateescape"``: a tokenizer cannot encode it); the message names its position.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            msg = f"prompt is empty ({prompt!r}); pass a question such as 'What is the capital of France?'"
            raise InvalidPromptError(msg)
        messages = [ChatMessage("user", prompt)]
    else:
        if not isinstance(prompt, Sequence) or not prompt:
            msg = f"prompt must be a non-empty string or a non-empty list of chat messages, got {prompt!r}"
            raise InvalidPromptError(msg)
        messages = []
        for i, m in enumerate(prompt):
            if isinstance(m, ChatMessage):
                messages.append(m)
            elif isinstance(m, Mapping) and "role" in m and "content" in m:
                messages.append(ChatMessage(m["role"], m["content"]))  # type: ignore[arg-type]
            else:
                msg = f"chat message {i} must be a ChatMessage or a mapping with 'role' and 'content', got {m!r}"
                raise InvalidPromptError(msg)
        if not any(m.content.strip() for m in messages if m.role != "system"):
            msg = "every user/assistant message is empty; add the question as a user message"
            raise InvalidPromptError(msg)
    for i, m in enumerate(messages):
        _check_unicode(m.content, "prompt" if isinstance(prompt, str) else f"chat message {i} ({m.role})")
    if system is not None:
        _check_unicode(system, "system message")
    if system is not None and messages[0].role != "system":
        messages.insert(0, ChatMessage("system", system))
    return messages


def question_of(messages: Sequence[ChatMessage]) -> str:
    """The question of a prompt: its last user turn; with no user turn, its last message's text
    ("" for no messages). The one definition every backend, guard and adapter reads."""
    for m in reversed(messages):
        if m.role == "user":
            return m.content
    return messages[-1].content if messages else ""


def _check_unicode(text: object, what: str) -> None:
    """Reject a lone surrogate (not encodable as UTF-8) in ``text``, naming its position."""
    if not isinstance(text, str):
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        msg = (
            f"{what} has a lone surrogate {text[exc.start]!r} at position {exc.start}, which is not valid Unicode "
            "(often bytes decoded with errors='surrogateescape'); pass UTF-8 text, e.g. decode it with errors='replace'"
        )
        raise InvalidPromptError(msg) from exc


@dataclass(frozen=True)
class DynamicTemperature:
    """Dynamic decoding (Ma et al. 2025): the sampling temperature falls as EU rises.

    ``T_t = t_min + (t_max - t_min) * (1 - EU_t) ** power`` where ``EU_t`` is the current
    step's epistemic uncertainty in (0, 1]: a token the model knows little about is sampled
    near-greedily, a well-known step keeps diversity. EU is clamped to [0, 1] first.
    :meth:`temperature` is the scalar form, :meth:`temperatures` the tensor form (what
    :class:`~logtoku_guard.backends.processors.DynamicTemperatureLogitsWarper` applies);
    both evaluate the one formula of :meth:`_schedule`.
    """

    t_max: float = 1.0
    t_min: float = 0.1
    power: float = 1.0

    def __post_init__(self) -> None:
        if not (0 < self.t_min <= self.t_max) or not math.isfinite(self.t_max):
            msg = f"dynamic temperature needs 0 < t_min <= t_max (finite), got t_min={self.t_min!r}, t_max={self.t_max!r}"
            raise ConfigurationError(msg)
        if not (self.power > 0) or not math.isfinite(self.power):
            msg = f"dynamic temperature power must be a positive number, got {self.power!r}"
            raise ConfigurationError(msg)

    def temperature(self, eu: float) -> float:
        """The temperature for one step with epistemic uncertainty ``eu`` (scalar form)."""
        return float(self._schedule(min(max(eu, 0.0), 1.0)))

    def temperatures(self, eu: torch.Tensor) -> torch.Tensor:
        """The temperature of each step: ``eu`` of any shape -> a tensor of that shape and dtype."""
        return self._schedule(eu.clamp(0.0, 1.0))

    def _schedule(self, e: Any) -> Any:
        """``T(e)`` for a float or a tensor ``e`` already in [0, 1]."""
        return self.t_min + (self.t_max - self.t_min) * (1.0 - e) ** self.power


GREEDY_BELOW = 1e-3
"""A positive temperature below this decodes greedily. Dividing the logits by a temperature of 1e-38
overflows even float32 (the draw is then noise), and half precision overflows below about 5e-4;
at 1e-3 a logit ahead by 0.01 is already drawn 22,000 times as often as the one behind it."""


@dataclass(frozen=True)
class DecodingOptions:
    """How to decode. ``temperature == 0`` is greedy (so is one below :data:`GREEDY_BELOW`); ``dynamic`` overrides temperature.

    ``constraint``: what the answer must look like (:class:`~logtoku_guard.tools.constraints.JsonSchema`
    or :class:`~logtoku_guard.tools.constraints.ToolCalls`), enforced by grammar-constrained decoding
    (the ``tools`` extra); the scores stay those of the raw, unmasked logits. None: free text.

    ``logit_bias`` (``(token id, bias)`` pairs, bias from -100 to 100), ``frequency_penalty`` and
    ``presence_penalty`` (-2 to 2) act as OpenAI defines them on the logits that choose the next token
    (a token's logit minus ``frequency_penalty`` times its count in the answer so far, minus
    ``presence_penalty`` once it appears, plus its bias); the scores stay those of the raw logits
    (:mod:`logtoku_guard.backends.processors`). A backend that cannot apply them refuses them.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    dynamic: DynamicTemperature | None = None
    constraint: Constraint | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.constraint is not None and not isinstance(self.constraint, (JsonSchema, ToolCalls)):
            msg = f"constraint must be JsonSchema(schema), ToolCalls(tools, choice) or None, got {self.constraint!r:.80}"
            raise ConfigurationError(msg)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            msg = f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}"
            raise ConfigurationError(msg)
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, (int, float))
            or not (0 <= self.temperature < math.inf)
        ):
            msg = f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}"
            raise ConfigurationError(msg)
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not (0 < self.top_p <= 1):
            msg = f"top_p must be in (0, 1], got {self.top_p!r}"
            raise ConfigurationError(msg)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            msg = f"seed must be a non-negative integer or None, got {self.seed!r}"
            raise ConfigurationError(msg)
        if self.dynamic is not None and not isinstance(self.dynamic, DynamicTemperature):
            msg = f"dynamic must be a DynamicTemperature(t_max=..., t_min=...) or None, got {self.dynamic!r}"
            raise ConfigurationError(msg)
        if isinstance(self.stop, str):
            stop: tuple[Any, ...] = (self.stop,)
        elif isinstance(self.stop, (list, tuple)):
            stop = tuple(self.stop)
        else:
            msg = f"stop must be a string or a list of strings, got {self.stop!r}"
            raise ConfigurationError(msg)
        if any(not isinstance(s, str) or not s for s in stop):
            msg = f"stop strings must be non-empty strings, got {self.stop!r}"
            raise ConfigurationError(msg)
        object.__setattr__(self, "stop", stop)
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (-2 <= value <= 2):
                msg = f"{name} must be a number from -2 to 2 (0: none), got {value!r}"
                raise ConfigurationError(msg)
        try:
            bias = tuple((int(i), float(b)) for i, b in dict(self.logit_bias).items())
        except (TypeError, ValueError):
            bias = None
        if bias is None or any(isinstance(i, bool) or i < 0 or not (-100 <= b <= 100) for i, b in bias):
            msg = f"logit_bias must be (token id >= 0, bias from -100 to 100) pairs, got {self.logit_bias!r:.120}"
            raise ConfigurationError(msg)
        object.__setattr__(self, "logit_bias", tuple(sorted(bias)))

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn (else the arg-max is taken): a dynamic temperature, or a temperature of
        at least :data:`GREEDY_BELOW` (a smaller positive one decodes greedily on every backend)."""
        return self.dynamic is not None or self.temperature >= GREEDY_BELOW

    @property
    def logit_params(self) -> tuple[str, ...]:
        """The names of the logit parameters set (``logit_bias``, ``frequency_penalty``, ``presence_penalty``)."""
        return tuple(
            name
            for name, on in (
                ("logit_bias", bool(self.logit_bias)),
                ("frequency_penalty", self.frequency_penalty != 0),
                ("presence_penalty", self.presence_penalty != 0),
            )
            if on
        )

    def replace(self, **changes: Any) -> DecodingOptions:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class TokenScore:
    """One generated token with its raw top-K logits and uncertainties.

    ``au``/``eu``: higher = more uncertain. ``logprob``: log p of this token under the softmax
    of the raw logits (higher = more confident). ``entropy``: of that softmax, in nats.
    ``alt_logits``/``alt_ids``: the backend's wider top raw logits (its ``max_logprobs``,
    largest first, the first K equal to ``top_logits``) for OpenAI-style ``top_logprobs``;
    never used for AU/EU; ``()`` when the backend keeps only the K.
    """

    index: int
    id: int
    text: str
    top_logits: tuple[float, ...]
    top_ids: tuple[int, ...]
    au: float
    eu: float
    logprob: float
    entropy: float
    temperature: float | None = None
    alt_logits: tuple[float, ...] = ()
    alt_ids: tuple[int, ...] = ()

    def top_logprobs(self, n: int) -> list[tuple[int, float]]:
        """The ``n`` likeliest token ids with their log-probabilities, from the stored raw logits.

        Every log-probability shares the normaliser ``logsumexp(z)``, which the chosen token
        gives away (``z_chosen - logprob``), so ``logprob_j = z_j - z_chosen + logprob``. Uses
        ``alt_logits`` when kept, else the top K; ``[]`` when the chosen token is not among them.
        """
        ids, logits = (self.alt_ids, self.alt_logits) if self.alt_ids else (self.top_ids, self.top_logits)
        if n <= 0 or self.id not in ids:
            return []
        lse = logits[ids.index(self.id)] - self.logprob
        return [(i, z - lse) for i, z in zip(ids[:n], logits[:n])]

    @property
    def uncertainty(self) -> float:
        """``AU * EU``; higher = less reliable."""
        return self.au * self.eu

    def quadrant(self, thresholds: QuadrantThresholds) -> Quadrant:
        return thresholds.classify(self.au, self.eu)


@dataclass(frozen=True)
class ResponseScore:
    """Response-level scores, all with higher = more reliable.

    ``reliability``: ``-mean(u)`` over the ``top_n`` least reliable tokens (the paper's
    score); ``reliability_mean``: ``-mean(u)`` over all tokens; ``probability_reliability``
    and ``entropy_reliability``: the same top-N aggregation of ``-log p`` and entropy.
    NaN for an empty answer (or raw-mode NaN tokens).
    """

    reliability: float
    reliability_mean: float
    probability_reliability: float
    entropy_reliability: float
    n_tokens: int
    top_n: int

    @classmethod
    def from_tokens(cls, tokens: Sequence[TokenScore], top_n: int = DEFAULT_TOP_N) -> ResponseScore:
        """The scores of ``tokens``, in float64 Python (no torch: a llama.cpp process never imports it)."""
        u = [t.uncertainty for t in tokens]
        return cls(
            reliability=-top_n_mean_of(u, top_n),
            reliability_mean=-mean_of(u),
            probability_reliability=-top_n_mean_of([-t.logprob for t in tokens], top_n),
            entropy_reliability=-top_n_mean_of([t.entropy for t in tokens], top_n),
            n_tokens=len(tokens),
            top_n=top_n,
        )


@dataclass(frozen=True)
class Timings:
    """Wall-clock timings of one generation, in seconds."""

    total_s: float
    first_token_s: float | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class Generation:
    """One answer with every token's scores: what a backend returns."""

    model: str
    prompt: str
    text: str
    tokens: tuple[TokenScore, ...]
    finish_reason: FinishReason
    k: int = DEFAULT_K
    evidence: EvidenceMode = "clamped"
    top_n: int = DEFAULT_TOP_N
    prompt_tokens: int = 0
    stop_sequence: str | None = None
    timings: Timings = field(default_factory=lambda: Timings(0.0, None, None))
    prompt_scores: tuple[TokenScore, ...] = ()
    """The question's own tokens scored teacher-forced from the prefill pass (the logits before
    each token score it; :mod:`logtoku_guard.backends.prompt_scoring`); empty when the backend
    does not see the prompt's logits (OpenAI-compatible servers, scripted backends)."""

    @cached_property
    def score(self) -> ResponseScore:
        return ResponseScore.from_tokens(self.tokens, self.top_n)

    @property
    def reliability(self) -> float:
        return self.score.reliability

    def words(self) -> list[WordScore]:
        """Word-level AU/EU (max over sub-tokens)."""
        from logtoku_guard.scoring.uncertainty import word_scores

        return word_scores([t.text for t in self.tokens], [t.au for t in self.tokens], [t.eu for t in self.tokens])
