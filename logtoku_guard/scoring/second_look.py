"""Second-look statistics: how stable an answer is, measured only when a policy rule reaches them.

One pass reads the model's evidence for its answer; a confident slip (the wrong person, the
wrong planet) has good evidence. What a second look can see is whether the answer holds:

* **self-check** (``self_check_yes``, ``self_check_au``, ``self_check_eu``): one prefill of the
  question, the answer and a verification prompt ("Is the proposed answer correct? Answer yes
  or no."), no generation beyond the one verdict token. ``self_check_yes`` is P(yes) normalised
  over yes/no, read from the verdict token's raw top logits (the backend keeps its
  ``max_logprobs`` largest); ``self_check_au``/``self_check_eu`` are LogTokU's AU/EU of the
  best yes logit against the best no logit (:func:`~logtoku_guard.scoring.uncertainty.au_eu`,
  K = 2): the model's evidence for its own verdict.
* **sampling agreement** (``sampling_agreement``): N answers sampled at a stated temperature;
  the mean share of the first answer's key claim (its first :data:`KEY_WORDS` claim words,
  :func:`~logtoku_guard.scoring.claims.claim_words`) that each sample states.
* **paraphrase agreement** (``paraphrase_agreement``): the question asked in fixed rewordings
  (templates); the same share, for each reworded question's greedy answer.

Higher ``*_yes``/``*_agreement`` = more reliable; higher ``self_check_au``/``self_check_eu`` =
more uncertain (:data:`SECOND_LOOK_HIGHER_IS_RELIABLE`). Each look's settings (prompt, N,
temperature, templates) are a policy's ``second_look`` section (:class:`SecondLookSettings`); its
cost and inputs are kept with its values (:class:`Measurement`), never its samples' text.

This module is the maths and the judge: no backend. The looks are taken by the guard's I/O
(:meth:`logtoku_guard.guard.guard_io.BackendIO.measure`) when the loop asks for them
(:class:`logtoku_guard.guard.guard_steps.Measure`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from logtoku_guard.scoring.claims import FUNCTION_WORDS, claim_words
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.templates import check_template

if TYPE_CHECKING:
    from logtoku_guard.scoring.uncertainty import EvidenceMode
    from logtoku_guard.types import TokenScore

__all__ = [
    "KEY_WORDS",
    "LOOK_OF",
    "SECOND_LOOK_HIGHER_IS_RELIABLE",
    "SECOND_LOOK_STATS",
    "Look",
    "LookedStats",
    "Measurement",
    "ParaphraseSettings",
    "SamplingSettings",
    "SecondLookSettings",
    "SecondLookStat",
    "SecondLooks",
    "SelfCheckSettings",
    "agreement",
    "claim_key",
    "looks_for",
    "verdict",
]

SecondLookStat = Literal["self_check_yes", "self_check_au", "self_check_eu", "sampling_agreement", "paraphrase_agreement"]
SECOND_LOOK_STATS: tuple[str, ...] = get_args(SecondLookStat)
SECOND_LOOK_HIGHER_IS_RELIABLE: frozenset[str] = frozenset({"self_check_yes", "sampling_agreement", "paraphrase_agreement"})
"""Second-look statistics where higher is more reliable (``self_check_au``/``_eu``: higher = more uncertain)."""

Look = Literal["self_check", "sampling", "paraphrase"]
LOOK_OF: dict[str, Look] = {
    "self_check_yes": "self_check",
    "self_check_au": "self_check",
    "self_check_eu": "self_check",
    "sampling_agreement": "sampling",
    "paraphrase_agreement": "paraphrase",
}
"""The look that measures each statistic (one look gives all of its statistics)."""

KEY_WORDS = 3
"""How many of the first answer's claim words make its key claim."""

_TEMPLATE_WORDS = frozenset({"answer", "correct", "question", "think", "believe", "sure", "actually", "probably"})
"""Words of an answer's frame ("the answer is ...") that are never its key claim, beside :data:`FUNCTION_WORDS`."""
_WORD = re.compile(r"[\w]+(?:[.'\-][\w]+)*", re.UNICODE)


# -- settings (a policy's ``second_look`` section) ---------------------------------------------------
class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SelfCheckSettings(_Settings):
    """``prompt``: the verification turn, with ``{question}`` and ``{answer}``; ``yes``/``no``: the
    verdict words (case and surrounding spaces ignored; each must be one token of the model to count)."""

    prompt: str = "Question: {question}\nProposed answer: {answer}\nIs the proposed answer correct? Answer yes or no."
    yes: tuple[str, ...] = ("yes",)
    no: tuple[str, ...] = ("no",)

    @field_validator("prompt")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        check_template(v, {"question", "answer"}, "second_look.self_check.prompt", question="q", answer="a")
        if "{question}" not in v or "{answer}" not in v:
            msg = f"second_look.self_check.prompt must contain {{question}} and {{answer}}, got {v[:80]!r}"
            raise ValueError(msg)
        return v

    @field_validator("yes", "no")
    @classmethod
    def _words(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        words = tuple(w.strip().lower() for w in v)
        if not words or any(not w or len(w) > 32 for w in words):
            msg = f"verdict words must be 1 to 32 characters each, at least one, got {list(v)!r:.120}"
            raise ValueError(msg)
        return words


class SamplingSettings(_Settings):
    """``n`` answers sampled at ``temperature`` (each at most ``max_new_tokens``), rows of one batch; ``seed``
    makes the samples reproducible (None: fresh randomness each time)."""

    n: int = Field(default=4, ge=1, le=16)
    temperature: float = Field(default=0.7, gt=0.0, le=2.0)
    max_new_tokens: int = Field(default=48, ge=1, le=512)
    seed: Optional[int] = Field(default=0, ge=0)  # noqa: UP045 - pydantic field on 3.10


class ParaphraseSettings(_Settings):
    """The question asked again through each of ``templates`` (``{question}``: the question as asked), greedy."""

    templates: tuple[str, ...] = (
        "Please answer this question: {question}",
        "Here is a question for you. {question} What is the answer?",
    )
    max_new_tokens: int = Field(default=48, ge=1, le=512)

    @field_validator("templates")
    @classmethod
    def _placeholders(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not 1 <= len(v) <= 4:
            msg = f"second_look.paraphrase.templates holds 1 to 4 templates, got {len(v)}"
            raise ValueError(msg)
        for t in v:
            check_template(t, {"question"}, "second_look.paraphrase.templates", question="q")
            if "{question}" not in t:
                msg = f"each paraphrase template must contain {{question}}, got {t[:80]!r}"
                raise ValueError(msg)
        return v


class SecondLookSettings(_Settings):
    """How each look is taken (a policy's ``second_look:`` section); a look runs only when a rule reaches its statistics."""

    self_check: SelfCheckSettings = SelfCheckSettings()
    sampling: SamplingSettings = SamplingSettings()
    paraphrase: ParaphraseSettings = ParaphraseSettings()

    def inputs(self, look: Look) -> dict[str, str | int | float]:
        """What ``look`` is measured with, as recorded beside its values (the audit record, the trace)."""
        if look == "self_check":
            s = self.self_check
            return {"prompt": s.prompt, "yes": "|".join(s.yes), "no": "|".join(s.no)}
        if look == "sampling":
            p = self.sampling
            out: dict[str, str | int | float] = {"n": p.n, "temperature": p.temperature, "max_new_tokens": p.max_new_tokens}
            if p.seed is not None:
                out["seed"] = p.seed
            return out
        return {"templates": " | ".join(self.paraphrase.templates), "n": len(self.paraphrase.templates)}


# -- measured values --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """One look taken: its statistics (NaN where undefined, ``why`` says so), its cost and inputs.

    ``tokens``: tokens the model processed for it (prompt and generated, every row); ``seconds``:
    wall-clock time; ``inputs``: what it was measured with (:meth:`SecondLookSettings.inputs`).
    No sample text is kept.
    """

    look: Look
    values: Mapping[str, float]
    tokens: int
    seconds: float
    inputs: Mapping[str, str | int | float] = field(default_factory=dict)
    why: str | None = None

    def __post_init__(self) -> None:
        wrong = sorted(set(self.values) - {s for s, lk in LOOK_OF.items() if lk == self.look})
        if wrong:
            msg = f"a {self.look} measurement cannot hold {wrong}; its statistics are {looks_stats(self.look)}"
            raise ValueError(msg)

    def cost(self) -> dict[str, float]:
        """Its cost and numeric inputs under ``second_look.<look>.*`` (the decision's stats, the audit record)."""
        out = {f"second_look.{self.look}.tokens": float(self.tokens), f"second_look.{self.look}.seconds": self.seconds}
        for name, value in self.inputs.items():
            if isinstance(value, (int, float)):
                out[f"second_look.{self.look}.{name}"] = float(value)
        return out


def looks_stats(look: Look) -> list[str]:
    return [s for s, lk in LOOK_OF.items() if lk == look]


def looks_for(stats: Iterable[str]) -> tuple[Look, ...]:
    """The looks that measure ``stats`` (second-look statistic names), in a fixed order (cheapest first)."""
    wanted = {LOOK_OF[s] for s in stats if s in LOOK_OF}
    return tuple(lk for lk in get_args(Look) if lk in wanted)


@dataclass(frozen=True)
class SecondLooks:
    """The looks taken for one answer so far."""

    measurements: tuple[Measurement, ...] = ()

    def taken(self, look: Look) -> bool:
        return any(m.look == look for m in self.measurements)

    def measured(self, stat: str) -> bool:
        return stat in LOOK_OF and self.taken(LOOK_OF[stat])

    def value(self, stat: str) -> float:
        """The measured value (NaN: not measured, or undefined)."""
        for m in self.measurements:
            if stat in m.values:
                return float(m.values[stat])
        return math.nan

    def why(self, stat: str) -> str | None:
        for m in self.measurements:
            if m.look == LOOK_OF.get(stat):
                return m.why if m.why is not None else "NaN scores"
        return "not measured: no second look was taken for this answer"

    def with_(self, more: Iterable[Measurement]) -> SecondLooks:
        return SecondLooks((*self.measurements, *more))

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.measurements)

    @property
    def seconds(self) -> float:
        return sum(m.seconds for m in self.measurements)


@dataclass(frozen=True)
class LookedStats(ResponseStats):
    """An answer's :class:`~logtoku_guard.scoring.stats.ResponseStats` and its second looks: what a policy
    with second-look rules reads. A second-look statistic not measured (yet) is NaN, undefined
    ("not measured: ..."); :meth:`as_dict` adds the measured ones and each look's cost."""

    looks: SecondLooks = SecondLooks()

    @classmethod
    def of(cls, stats: ResponseStats, looks: SecondLooks = SecondLooks()) -> LookedStats:
        base = {f: getattr(stats, f) for f in stats.__dataclass_fields__}
        base.pop("looks", None)
        return cls(**base, looks=looks)

    def get(self, name: str) -> float:
        if name in LOOK_OF:
            return self.looks.value(name)
        return super().get(name)

    def undefined_reason(self, name: str) -> str | None:
        if name in LOOK_OF:
            return None if not math.isnan(self.looks.value(name)) else self.looks.why(name)
        return super().undefined_reason(name)

    def as_dict(self) -> dict[str, float | None]:
        out = super().as_dict()
        for m in self.looks.measurements:
            for name, value in m.values.items():
                out[name] = value if math.isfinite(value) else None
            out.update(m.cost())
        return out


# -- the self-check verdict ---------------------------------------------------------------------------
def verdict(
    token: TokenScore,
    text_of: Callable[[int], str],
    yes: Sequence[str] = ("yes",),
    no: Sequence[str] = ("no",),
    evidence: EvidenceMode = "clamped",
) -> tuple[dict[str, float], str | None]:
    """``self_check_yes`` / ``_au`` / ``_eu`` of the verdict ``token`` (the first token after the
    verification prompt), from its kept raw top logits (``alt_logits``, else ``top_logits``);
    ``text_of`` gives a token id's text. Returns the values and why they are undefined (None: defined).

    P(yes) = sigmoid(lse(yes logits) - lse(no logits)). A side with no token among the kept logits
    is bounded by the smallest kept logit (its logit is at most that), so the value is a bound
    then; neither side among them: all NaN.
    """
    import numpy as np

    from logtoku_guard.scoring.uncertainty import au_eu

    ids, logits = (token.alt_ids, token.alt_logits) if token.alt_ids else (token.top_ids, token.top_logits)
    yes_set, no_set = {w.lower() for w in yes}, {w.lower() for w in no}
    sides: dict[str, list[float]] = {"yes": [], "no": []}
    for i, z in zip(ids, logits):
        word = text_of(int(i)).strip().lower()
        if word in yes_set:
            sides["yes"].append(float(z))
        elif word in no_set:
            sides["no"].append(float(z))
    nan = {"self_check_yes": math.nan, "self_check_au": math.nan, "self_check_eu": math.nan}
    if not logits or not any(math.isfinite(z) for z in logits):
        return nan, "the verdict token has no finite logits"
    if not sides["yes"] and not sides["no"]:
        return nan, f"neither a yes nor a no token among the verdict's {len(logits)} largest logits"
    floor = min(float(z) for z in logits)
    z_yes = _lse(sides["yes"]) if sides["yes"] else floor
    z_no = _lse(sides["no"]) if sides["no"] else floor
    p_yes = 1.0 / (1.0 + math.exp(min(z_no - z_yes, 700.0)))
    au, eu = au_eu(np.array([[max(sides["yes"], default=floor), max(sides["no"], default=floor)]]), evidence)
    return {"self_check_yes": p_yes, "self_check_au": float(au[0]), "self_check_eu": float(eu[0])}, None


def _lse(values: Sequence[float]) -> float:
    import numpy as np

    return float(np.logaddexp.reduce(np.asarray(values, dtype=np.float64)))


# -- agreement with the first answer's key claim ------------------------------------------------------
def _norm(word: str) -> str:
    m = _WORD.search(word.lower())
    return m.group(0) if m else ""


def _stem(word: str) -> str:
    """``word`` without a possessive ("Latvia's" and "Latvia" are the same word of the question)."""
    return word[:-2] if word.endswith("'s") else word


def claim_key(tokens: Sequence[TokenScore], question: str, size: int = KEY_WORDS) -> tuple[str, ...]:
    """The answer's key claim: its first ``size`` claim words (not in the question, not function or
    answer-frame words), normalised (lower case, punctuation stripped)."""
    asked = {_stem(_norm(w)) for w in question.split()}
    out: list[str] = []
    for w in claim_words(tokens, question, limit=None):
        key = _norm(w.text)
        if key and key not in _TEMPLATE_WORDS and key not in FUNCTION_WORDS and _stem(key) not in asked and key not in out:
            out.append(key)
        if len(out) >= size:
            break
    return tuple(out)


def agreement(key: Sequence[str], texts: Sequence[str]) -> float:
    """Mean over ``texts`` of the share of ``key``'s words each states (0 to 1); NaN without a key or texts."""
    if not key or not texts:
        return math.nan
    shares = []
    for text in texts:
        said = {_norm(w) for w in _WORD.findall(text.lower())}
        shares.append(sum(1 for k in key if k in said) / len(key))
    return sum(shares) / len(shares)
