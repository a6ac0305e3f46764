"""Declarative, validated guard policies: ordered rules over response statistics -> an action.

A policy is data (a dict, YAML or JSON file), validated by pydantic: an unknown field,
action or statistic, or an out-of-range threshold, is an error naming the field and value.
Thresholds are absolute numbers or ``{quantile: q}`` of the model's own profile (see
:mod:`logtoku_guard.calibration`), resolved when the policy meets a profile.

Example (YAML)::

    name: qa
    version: "1"
    rules:
      - name: no-knowledge
        when: {stat: reliability, op: "<", value: {quantile: 0.1}}
        action: retrieve
        reason: answer is among the 10% least reliable of this model
      - name: shaky-start
        when:
          all:
            - {stat: first_eu, op: ">", value: {quantile: 0.8}}
            - {stat: unreliable_share, op: ">", value: 0.5}
        action: warn
    default_action: pass

Undefined statistics (NaN: an empty answer, NaN token scores in raw evidence mode) count as
the *least reliable* value by default (``undefined: least_reliable``): a comparison that
asks "less reliable than the threshold" fires on them (``<``/``<=`` on ``reliability*``,
``>``/``>=`` on the uncertainty statistics and ``n_tokens``), and the reason says
``undefined: empty answer``. ``undefined: never_fires`` restores the old rule (no comparison
on a NaN or infinite value fires). Files are read within bounds (size, values, nesting, no
YAML aliases: :mod:`logtoku_guard.policy_loading`).
"""

from __future__ import annotations

import math
import operator
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from logtoku_guard.errors import ConfigurationError, PolicyError, short_repr
from logtoku_guard.policy_loading import check_bounds, read_policy_file
from logtoku_guard.stats import HIGHER_IS_RELIABLE, MONOTONE_INCREASING, ResponseStats, StatName

if TYPE_CHECKING:
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.payloads import DecisionPayload

ActionName = Literal["pass", "warn", "retrieve", "abstain", "human_review", "raise"]
Op = Literal[">", ">=", "<", "<="]
UndefinedMode = Literal["least_reliable", "never_fires"]
_OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def _policy_error(exc: ValidationError) -> PolicyError:
    """:meth:`PolicyError.from_validation`, except that a value outside a fixed set (a stat or
    action name with a typo) is named with the closest allowed values and the whole set, uncut."""
    import difflib

    errors = exc.errors(include_url=False)
    if not any(e["type"] == "literal_error" for e in errors):
        return PolicyError.from_validation(exc)
    lines = []
    for err in errors[:20]:
        loc = ".".join(str(p) for p in err["loc"] if p not in ("Compare", "AllOf", "AnyOf", "NotOf"))[:120] or "<policy>"
        given = err.get("input")
        if err["type"] == "literal_error":
            allowed = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
            close = difflib.get_close_matches(given, allowed, n=2, cutoff=0.6) if isinstance(given, str) else []
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            lines.append(f"{loc}: {short_repr(given)} is not allowed; {hint}allowed: {', '.join(allowed)}")
        else:
            lines.append(f"{loc}: {err['msg'][:300]} (got {short_repr(given)})")
    if len(errors) > 20:
        lines.append(f"... and {len(errors) - 20} more error(s)")
    return PolicyError("invalid policy:\n  " + "\n  ".join(lines))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Quantile(_Strict):
    """A threshold placed at quantile ``quantile`` of the model profile's distribution of the stat."""

    quantile: float = Field(ge=0.0, le=1.0)


class Compare(_Strict):
    """``stat op value``. ``fallback``: the statistic compared instead when ``stat`` is
    unavailable (its profile grid is missing or all NaN for a quantile threshold, its value NaN
    for a fixed one), e.g. ``guard_score`` falling back to ``reliability`` with a profile that
    holds no fitted guard; the recorded check names the statistic actually used."""

    stat: StatName
    op: Op
    value: Union[float, Quantile]  # noqa: UP007 - pydantic union
    fallback: Optional[StatName] = None  # noqa: UP045 - pydantic field on 3.10
    fallback_value: Optional[Union[float, Quantile]] = None  # noqa: UP007, UP045 - pydantic field on 3.10
    """The threshold of ``fallback`` when it differs from ``value`` (e.g. an absolute ``guard_score``
    probability falling back to a quantile of ``reliability``); default: ``value``."""

    @field_validator("value", "fallback_value")
    @classmethod
    def _finite(cls, v: float | Quantile | None) -> float | Quantile | None:
        if isinstance(v, float) and not math.isfinite(v):
            msg = f"threshold must be finite, got {v!r}"
            raise ValueError(msg)
        return v

    @model_validator(mode="after")
    def _fallback_value_needs_a_fallback(self) -> Compare:
        if self.fallback_value is not None and self.fallback is None:
            msg = f"fallback_value {self.fallback_value!r} is given without a fallback statistic; add fallback: <stat>"
            raise ValueError(msg)
        return self

    def threshold_of(self, stat: str) -> float | Quantile:
        """The threshold compared with ``stat`` (``value``, or ``fallback_value`` for the fallback)."""
        if stat != self.stat and self.fallback_value is not None:
            return self.fallback_value
        return self.value


class AllOf(_Strict):
    all: list[Condition] = Field(min_length=1)


class AnyOf(_Strict):
    any: list[Condition] = Field(min_length=1)


class NotOf(_Strict):
    not_: Condition = Field(alias="not")


def _condition_kind(v: Any) -> str:
    if isinstance(v, BaseModel):
        return type(v).__name__
    if isinstance(v, Mapping):
        for key, tag in (("stat", "Compare"), ("all", "AllOf"), ("any", "AnyOf"), ("not", "NotOf")):
            if key in v:
                return tag
    return "Compare"  # reports the missing fields of a comparison


Condition = Annotated[
    Union[  # noqa: UP007
        Annotated[Compare, Tag("Compare")],
        Annotated[AllOf, Tag("AllOf")],
        Annotated[AnyOf, Tag("AnyOf")],
        Annotated[NotOf, Tag("NotOf")],
    ],
    Discriminator(_condition_kind),
]
AllOf.model_rebuild()
AnyOf.model_rebuild()
NotOf.model_rebuild()


class Rule(_Strict):
    """When ``when`` holds, take ``action``; ``reason`` is shown to users and auditors.

    ``early_stop``: while streaming, stop generating as soon as the rule has fired on the
    prefix. Allowed only for conditions that cannot un-fire as the answer grows (``>``/``>=``
    on ``max_eu``, ``max_au``, ``n_tokens``, combined with ``all``/``any``).
    """

    name: str = Field(min_length=1)
    when: Condition
    action: ActionName
    reason: str = ""
    early_stop: bool = False

    @model_validator(mode="after")
    def _early_stop_is_sound(self) -> Rule:
        if self.early_stop and not _monotone(self.when):
            msg = (
                f"rule {self.name!r}: early_stop needs a condition that cannot un-fire as the answer grows "
                "('>'/'>=' on max_eu, max_au or n_tokens, joined by all/any)"
            )
            raise ValueError(msg)
        return self


def _monotone(c: Any) -> bool:
    if isinstance(c, Compare):
        return c.stat in MONOTONE_INCREASING and c.op in (">", ">=")
    if isinstance(c, AllOf):
        return all(_monotone(x) for x in c.all)
    if isinstance(c, AnyOf):
        return all(_monotone(x) for x in c.any)
    return False


class RetrieveSettings(_Strict):
    max_attempts: int = Field(default=1, ge=1, le=5)
    fallback: Literal["pass", "warn", "abstain", "human_review", "raise"] = "abstain"
    passages: int = Field(default=4, ge=1, le=50)
    context_template: str = (
        "Use the context to answer the question concisely. If the context does not contain the answer, "
        "say you don't know.\n\nContext:\n{context}\n\nQuestion: {question}"
    )

    timeout_s: float = Field(default=30.0, gt=0.0, le=3600.0)

    @field_validator("context_template")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        fields = _format_fields(v, "context_template")
        for name in ("context", "question"):
            if name not in fields:
                msg = f"context_template must contain {{{name}}}, got {short_repr(v)}"
                raise ValueError(msg)
        _only_fields(v, fields, {"context", "question"}, "context_template", context="c", question="q")
        return v

    def prompt(self, question: str, passages: Sequence[str]) -> str:
        """The retrieval-augmented user turn: the passages (blank-line separated) and the question."""
        return self.context_template.format(context="\n\n".join(passages), question=question)


class WarnSettings(_Strict):
    disclaimer: str = "Note: the model was unsure about parts of this answer; please verify it."


class AbstainSettings(_Strict):
    message: str = "I don't know."


class ReviewSettings(_Strict):
    message: str = "This answer is waiting for review by a person (review id {review_id})."

    @field_validator("message")
    @classmethod
    def _review_id_only(cls, v: str) -> str:
        _only_fields(v, _format_fields(v, "human_review.message"), {"review_id"}, "human_review.message", review_id=1)
        return v


def _format_fields(template: str, what: str) -> set[str]:
    """The replacement fields of a ``str.format`` template (raises ValueError on bad syntax)."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        msg = f"{what} is not a valid format string ({exc}; write literal braces as {{{{ and }}}}), got {short_repr(template)}"
        raise ValueError(msg) from None


def _only_fields(template: str, fields: set[str], allowed: set[str], what: str, **example: Any) -> None:
    extra = sorted(fields - allowed)
    if extra:
        names = ", ".join("{" + n + "}" for n in sorted(allowed))
        msg = (
            f"{what} may only use {names}, found {short_repr(extra)} in {short_repr(template)}; "
            "write literal braces as {{ and }}"
        )
        raise ValueError(msg)
    try:
        template.format(**example)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        msg = f"{what} cannot be filled in ({exc.__class__.__name__}: {exc}), got {short_repr(template)}"
        raise ValueError(msg) from None


class QuadrantSettings(_Strict):
    au_quantile: float = Field(default=0.5, ge=0.0, le=1.0)
    eu_quantile: float = Field(default=0.5, ge=0.0, le=1.0)


class Policy(_Strict):
    """An ordered list of rules; the first that fires decides, else ``default_action``."""

    name: str = Field(min_length=1)
    version: str = "1"
    description: str = ""
    rules: list[Rule] = Field(default_factory=list)
    default_action: ActionName = "pass"
    first_tokens: int = Field(default=5, ge=1, le=100)
    quadrants: QuadrantSettings = QuadrantSettings()
    retrieve: RetrieveSettings = RetrieveSettings()
    warn: WarnSettings = WarnSettings()
    abstain: AbstainSettings = AbstainSettings()
    human_review: ReviewSettings = ReviewSettings()
    undefined: UndefinedMode = "least_reliable"

    @model_validator(mode="after")
    def _unique_names(self) -> Policy:
        dupes = sorted(n for n, c in Counter(r.name for r in self.rules).items() if c > 1)
        if dupes:
            msg = f"rule names must be unique, repeated: {short_repr(dupes)}"
            raise ValueError(msg)
        return self

    # -- loading ----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """Validate ``data`` (at most :data:`~logtoku_guard.policy_loading.MAX_POLICY_NODES` values)."""
        if not isinstance(data, Mapping):
            msg = f"a policy must be a mapping (name, rules, ...), got {type(data).__name__} {short_repr(data)}"
            raise PolicyError(msg)
        check_bounds(data)
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise _policy_error(exc) from None
        except RecursionError:
            msg = "the policy is nested too deeply to validate; flatten the conditions"
            raise PolicyError(msg) from None

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """Load a YAML (``.yaml``/``.yml``) or JSON policy file, within the bounds of
        :mod:`~logtoku_guard.policy_loading` (size, values, nesting, no YAML aliases, UTF-8)."""
        p = Path(path)
        data = read_policy_file(p)
        if not isinstance(data, dict):
            msg = f"policy file {str(p)!r} must hold a mapping at the top level, got {type(data).__name__}"
            raise PolicyError(msg)
        return cls.from_dict(data)

    # -- evaluation -------------------------------------------------------------------------
    def uses_quantiles(self) -> bool:
        return any(_has_quantile(r.when) for r in self.rules)

    def actions(self) -> set[str]:
        acts: set[str] = {r.action for r in self.rules} | {self.default_action}
        if "retrieve" in acts:
            acts.add(self.retrieve.fallback)
        return acts

    def stats_used(self) -> set[str]:
        """The statistics the rules read, each comparison's ``fallback`` included."""
        found: set[str] = set()
        for r in self.rules:
            _collect_stats(r.when, found)
        return found

    def check_profile(self, profile: ModelProfile | None) -> None:
        """Raise :class:`ConfigurationError` now when a quantile threshold cannot be resolved
        against ``profile`` (no profile, or a statistic the profile lacks)."""
        for rule in self.rules:
            _check_quantiles(rule.when, profile)

    def decide(self, stats: ResponseStats, profile: ModelProfile | None = None, *, only_early_stop: bool = False) -> Decision:
        """The first rule that fires on ``stats`` (thresholds resolved against ``profile``).

        Undefined statistics follow ``self.undefined`` (see the module docstring); a rule that
        fired on one says so in its reason (``"...; undefined: empty answer"``).
        """
        for rule in self.rules:
            if only_early_stop and not rule.early_stop:
                continue
            checks: list[Check] = []
            if _eval(rule.when, stats, profile, checks, self.undefined):
                reason = rule.reason or _describe(checks)
                undefined = sorted({c.undefined for c in checks if c.undefined is not None})
                if undefined and rule.reason:
                    reason = f"{reason}; " + "; ".join(f"undefined: {u}" for u in undefined)
                return Decision(action=rule.action, rule=rule.name, reason=reason, checks=tuple(checks), stats=stats)
        return Decision(
            action=self.default_action,
            rule=None,
            reason="no rule fired",
            checks=(),
            stats=stats,
        )


@dataclass(frozen=True)
class Check:
    """One comparison a rule made: ``observed op threshold``.

    ``observed`` is None when the statistic is undefined (NaN); ``undefined`` then says why
    (``"empty answer"``, ``"NaN token scores"``, ...) and ``passed`` follows the policy's
    ``undefined`` setting (by default the value counts as the least reliable one).
    """

    stat: str
    op: str
    threshold: float
    observed: float | None
    passed: bool
    quantile: float | None = None
    undefined: str | None = None

    def describe(self) -> str:
        where = f" (q{self.quantile:g} of the profile)" if self.quantile is not None else ""
        if self.undefined is not None or self.observed is None:
            return f"{self.stat} {self.op} {self.threshold:.4g}{where}: undefined: {self.undefined}"
        return f"{self.stat} {self.observed:.4g} {self.op} {self.threshold:.4g}{where}"


@dataclass(frozen=True)
class Decision:
    """What the policy decided for one answer, and why."""

    action: ActionName
    rule: str | None
    reason: str
    checks: tuple[Check, ...]
    stats: ResponseStats

    def to_dict(self) -> DecisionPayload:
        """The JSON form (:func:`logtoku_guard.payloads.decision_payload`)."""
        from logtoku_guard.payloads import decision_payload

        return decision_payload(self)


def _collect_stats(c: Any, found: set[str]) -> None:
    if isinstance(c, Compare):
        found.add(c.stat)
        if c.fallback is not None:
            found.add(c.fallback)
    elif isinstance(c, (AllOf, AnyOf)):
        for x in c.all if isinstance(c, AllOf) else c.any:
            _collect_stats(x, found)
    else:
        _collect_stats(c.not_, found)


def _check_quantiles(c: Any, profile: ModelProfile | None) -> None:
    if isinstance(c, Compare):
        usable = c.fallback is None or not isinstance(c.value, Quantile) or (profile is not None and profile.has_stat(c.stat))
        _threshold(c, profile, c.stat if usable else c.fallback)
        if c.fallback is not None and isinstance(c.fallback_value, Quantile):  # the fallback may be needed per answer
            _threshold(c, profile, c.fallback)
    elif isinstance(c, (AllOf, AnyOf)):
        for x in c.all if isinstance(c, AllOf) else c.any:
            _check_quantiles(x, profile)
    else:
        _check_quantiles(c.not_, profile)


def _has_quantile(c: Any) -> bool:
    if isinstance(c, Compare):
        return isinstance(c.value, Quantile) or isinstance(c.fallback_value, Quantile)
    if isinstance(c, AllOf):
        return any(_has_quantile(x) for x in c.all)
    if isinstance(c, AnyOf):
        return any(_has_quantile(x) for x in c.any)
    return _has_quantile(c.not_)


def _stat_used(c: Compare, stats: ResponseStats, profile: ModelProfile | None) -> str:
    """``c.stat``, or ``c.fallback`` when ``c.stat`` is unavailable (see :class:`Compare`)."""
    if c.fallback is None:
        return c.stat
    if isinstance(c.value, Quantile):
        available = profile is not None and profile.has_stat(c.stat)
    else:
        available = math.isfinite(stats.get(c.stat))
    return c.stat if available else c.fallback


def _threshold(c: Compare, profile: ModelProfile | None, stat: str | None = None) -> tuple[float, float | None]:
    stat = stat or c.stat
    target = c.threshold_of(stat)
    if isinstance(target, Quantile):
        if profile is None:
            msg = (
                f"the rule on {c.stat!r} uses a quantile threshold but no model profile is loaded; "
                "run `logtoku-guard calibrate` or pass profile=..."
            )
            raise ConfigurationError(msg)
        value = float(profile.quantile(stat, target.quantile))
        if not math.isfinite(value):  # a validated profile never has one
            msg = f"the profile's {stat!r} grid is not finite at q{target.quantile:g}; re-run `logtoku-guard calibrate`"
            raise ConfigurationError(msg)
        return value, target.quantile
    return float(target), None


def _eval(c: Any, stats: ResponseStats, profile: ModelProfile | None, checks: list[Check], undefined: str) -> bool:
    if isinstance(c, Compare):
        stat = _stat_used(c, stats, profile)
        threshold, q = _threshold(c, profile, stat)
        observed = stats.get(stat)
        why = stats.undefined_reason(stat) if math.isnan(observed) else None
        if undefined == "never_fires":
            ok = math.isfinite(observed) and _OPS[c.op](observed, threshold)
        else:  # NaN is the least reliable value: -inf for reliability, +inf for the rest
            value = (-math.inf if stat in HIGHER_IS_RELIABLE else math.inf) if why is not None else observed
            ok = _OPS[c.op](value, threshold)
        checks.append(Check(stat, c.op, threshold, None if why is not None else observed, ok, q, why))
        return ok
    if isinstance(c, AllOf):
        return all([_eval(x, stats, profile, checks, undefined) for x in c.all])  # evaluate all: every check is recorded
    if isinstance(c, AnyOf):
        return any([_eval(x, stats, profile, checks, undefined) for x in c.any])
    return not _eval(c.not_, stats, profile, checks, undefined)


def _describe(checks: list[Check]) -> str:
    return "; ".join(c.describe() for c in checks)


DEFAULT_GUARD_THRESHOLD = 0.2474
"""The default policy flags an answer whose ``guard_score`` (its predicted probability of being
right) is below this.

Chosen by ``logtoku-guard eval traffic`` on the tune half of the realistic-traffic benchmark
(right and wrong answers to real questions, plausible and syllable-name fabrications): the
highest guard score that still passes 85% of the correct answers to real questions, out of
fold. On the test half it passed 83.9% [76.8, 90.2] of correct answers and flagged 73.3%
[66.5, 79.5] of wrong ones, 96.9% [93.8, 99.4] of plausible and 97.4% [94.0, 100] of
syllable-name fabrications (RESULTS.md section 8). Being a probability, it keeps its meaning
for a guard fit on another model's labelled answers (``calibrate --labels``)."""

DEFAULT_FLAG_QUANTILE = 0.796
"""Where :data:`DEFAULT_GUARD_THRESHOLD` lies in the embedded model's calibration profile; the
default policy flags below this quantile of ``reliability`` when a profile has no fitted guard."""


def default_policy() -> Policy:
    """The calibrated default: flag (retrieve, then abstain) an answer whose ``guard_score`` is below
    :data:`DEFAULT_GUARD_THRESHOLD`; every other answer passes.

    ``guard_score`` (:mod:`logtoku_guard.guard_score`) is the profile's learned combination of
    answer and prompt-side statistics, the predicted probability that the answer is right
    (higher = more reliable). Flagged answers go to retrieval, then abstention when still
    uncertain or without a retriever. A profile without a fitted guard (an older version, a
    model with no shipped fit and no ``--labels``) flags below quantile
    :data:`DEFAULT_FLAG_QUANTILE` of ``reliability`` instead (``fallback``), a much weaker signal.
    """
    t, q = DEFAULT_GUARD_THRESHOLD, DEFAULT_FLAG_QUANTILE
    return Policy.from_dict(
        {
            "name": "default",
            "version": "3",
            "description": (
                f"retrieve (then abstain) when guard_score, the answer's predicted probability of being right, is below {t:g}: "
                "on the realistic-traffic benchmark's test half this passed 84% of correct answers to real questions and "
                f"flagged 73% of wrong ones and 97% of invented-entity questions (below quantile {q:g} of reliability when "
                "the profile has no fitted guard score)"
            ),
            "rules": [
                {
                    "name": "low-guard-score",
                    "when": {
                        "stat": "guard_score",
                        "op": "<",
                        "value": t,
                        "fallback": "reliability",
                        "fallback_value": {"quantile": q},
                    },
                    "action": "retrieve",
                    "reason": f"the answer's predicted probability of being right is below {t:g}",
                },
            ],
            "default_action": "pass",
            "retrieve": {"max_attempts": 1, "fallback": "abstain"},
        }
    )
