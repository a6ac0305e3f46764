"""A backend that replays scripted top-K logits: test guards and pipelines without a model.

Each scripted answer is a list of text pieces with the raw top-K logits of each; AU and EU
are computed by the real maths. ``logprob`` and ``entropy`` are taken from the softmax over
the scripted logits only (the chosen token is the largest), an approximation a real vocab
would refine; everything else behaves like a real backend (stop strings, max_new_tokens,
streaming, batching). Stop strings cut an answer with the very functions the transformers
backend's step recorder uses (:func:`~logtoku_guard.backends.stop_strings.truncate_at_stop`).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

from logtoku_guard.backends.base import ScoringIdentity, TokenStream
from logtoku_guard.backends.stop_strings import truncate_at_stop
from logtoku_guard.errors import ConfigurationError, UsageError
from logtoku_guard.scoring.uncertainty import (
    DEFAULT_K,
    DEFAULT_TOP_N,
    EvidenceMode,
    rescore,
    row_lse_entropy,
)
from logtoku_guard.tools.constraints import refuse_constraint
from logtoku_guard.types import (
    ChatMessage,
    DecodingOptions,
    FinishReason,
    Generation,
    Prompt,
    TokenScore,
    question_of,
    to_messages,
)


@dataclass(frozen=True)
class ScriptedAnswer:
    """An answer to replay: one text piece and one row of raw top logits per token."""

    pieces: Sequence[str]
    top_logits: Sequence[Sequence[float]]

    def __post_init__(self) -> None:
        if len(self.pieces) != len(self.top_logits):
            msg = (
                f"a scripted answer needs one row of logits per piece, "
                f"got {len(self.pieces)} pieces and {len(self.top_logits)} rows"
            )
            raise ConfigurationError(msg)


Script = Sequence[ScriptedAnswer] | Callable[[list[ChatMessage]], ScriptedAnswer]


class ScriptedBackend(ScoringIdentity):
    """Replays answers in order (a list) or answers each prompt with ``script(messages)``.

    Args:
        script: the answers, in call order, or a function from the chat turns to an answer.
        k: top-K logits scored per token (each scripted row needs at least ``k``).
        evidence: ``"clamped"`` (default) or ``"raw"`` (reference reproduction: AU may be
            NaN or -inf, as with the paper's reference code); used for every token and recorded
            on every :class:`~logtoku_guard.types.Generation`.
        top_n: number of least reliable tokens averaged into the response reliability.
        model_name: the name recorded on each generation.

    ``calls`` lists the chat turns of every call, in order.
    """

    provider: ClassVar[str | None] = "logtoku_guard"
    """The ``gen_ai.provider.name`` of this backend's spans."""

    def __init__(
        self,
        script: Script,
        *,
        k: int = DEFAULT_K,
        evidence: EvidenceMode = "clamped",
        top_n: int = DEFAULT_TOP_N,
        model_name: str = "scripted",
    ) -> None:
        self._identify(model_name, k, evidence, top_n)
        self._script = script
        self._queue: Iterator[ScriptedAnswer] | None = None if callable(script) else iter(list(script))
        self._lock = threading.Lock()
        self.calls: list[list[ChatMessage]] = []

    def _next(self, messages: list[ChatMessage]) -> ScriptedAnswer:
        with self._lock:
            self.calls.append(messages)
            if self._queue is None:
                return self._script(messages)  # type: ignore[operator]
            try:
                return next(self._queue)
            except StopIteration:
                msg = f"the scripted backend ran out of answers after {len(self.calls) - 1} calls; script more answers"
                raise UsageError(msg) from None

    def _tokens(self, answer: ScriptedAnswer) -> list[TokenScore]:
        rows = [sorted((float(v) for v in r), reverse=True) for r in answer.top_logits]
        if any(len(r) < self._k for r in rows):
            msg = f"every scripted row needs at least k={self._k} logits"
            raise ConfigurationError(msg)
        if not rows:
            return []
        scored = rescore([r[: self._k] for r in rows], evidence=self._evidence)
        lses, entropies = row_lse_entropy(rows)
        out = []
        for i, (piece, r, lse, entropy) in enumerate(zip(answer.pieces, rows, lses, entropies)):
            out.append(
                TokenScore(
                    index=i,
                    id=i,
                    text=piece,
                    top_logits=tuple(r[: self._k]),
                    # the chosen token is the top-1 (its logprob is r[0]'s); the alternatives get ids of their own
                    top_ids=(i, *(i + j * len(rows) for j in range(1, self._k))),
                    au=float(scored.au[i]),
                    eu=float(scored.eu[i]),
                    logprob=r[0] - lse,
                    entropy=entropy,
                )
            )
        return out

    def _one(self, prompt: Prompt, options: DecodingOptions) -> Generation:
        refuse_constraint(options.constraint, "scripted", "it replays scripted answers")
        messages = to_messages(prompt)
        tokens = self._tokens(self._next(messages))
        finish: FinishReason = "stop"
        if len(tokens) > options.max_new_tokens:
            tokens, finish = tokens[: options.max_new_tokens], "length"
        tokens, stop_seq = truncate_at_stop(tokens, options.stop)
        if stop_seq is not None:
            finish = "stop"
        return Generation(
            model=self._name,
            prompt=question_of(messages),
            text="".join(t.text for t in tokens),
            tokens=tuple(tokens),
            finish_reason=finish,
            k=self._k,
            evidence=self._evidence,
            top_n=self._top_n,
            stop_sequence=stop_seq,
        )

    def generate(self, prompt: Prompt, options: DecodingOptions | None = None) -> Generation:
        return self._one(prompt, options or DecodingOptions())

    def batch(self, prompts: Sequence[Prompt], options: DecodingOptions | None = None) -> list[Generation]:
        return [self._one(p, options or DecodingOptions()) for p in prompts]

    def stream(self, prompt: Prompt, options: DecodingOptions | None = None) -> TokenStream:
        generation = self._one(prompt, options or DecodingOptions())
        cancelled = threading.Event()
        emitted: list[TokenScore] = []

        def tokens() -> Iterator[TokenScore]:
            for t in itertools.takewhile(lambda _: not cancelled.is_set(), generation.tokens):
                emitted.append(t)
                yield t

        def result() -> Generation:
            if len(emitted) == len(generation.tokens):
                return generation
            return dataclasses.replace(
                generation, tokens=tuple(emitted), text="".join(t.text for t in emitted), finish_reason="cancelled"
            )

        return TokenStream(tokens(), result, cancelled.set)
