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
``undefined: empty answer``. With ``undefined: never_fires`` no comparison on a NaN or
infinite value fires. Files are read within bounds (size, values, nesting, no
YAML aliases: :mod:`logtoku_guard.decision.policy_loading`).

A ``tool_calls:`` section holds the rules for an agent's tool calls (per-argument statistics;
actions ``run``, ``human_review``, ``reask``, ``refuse``): :mod:`logtoku_guard.decision.tool_gate.call_policy`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from logtoku_guard.decision.conditions import Check, Condition, comparisons, describe_checks, is_monotone, settled, unmeasured
from logtoku_guard.decision.policy_loading import check_bounds, read_policy_file
from logtoku_guard.decision.rules import RuleContext, StrictModel, UndefinedMode, first_firing
from logtoku_guard.decision.tool_gate.call_policy import ToolCallPolicy
from logtoku_guard.errors import PolicyError, short_repr
from logtoku_guard.scoring.second_look import LOOK_OF, Look, SecondLookSettings, looks_for
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.templates import check_template

if TYPE_CHECKING:
    from logtoku_guard.calibration import ModelProfile

ActionName = Literal["pass", "warn", "retrieve", "abstain", "human_review", "raise"]
_CONDITION_TAGS = ("Compare", "AllOf", "AnyOf", "NotOf", "ArgumentCompare", "ToolAllOf", "ToolAnyOf", "ToolNotOf")


def _policy_error(exc: ValidationError) -> PolicyError:
    """:meth:`PolicyError.from_validation`, except that a value outside a fixed set (a stat or
    action name with a typo) is named with the closest allowed values and the whole set, uncut."""
    import difflib

    errors = exc.errors(include_url=False)
    if not any(e["type"] == "literal_error" for e in errors):
        return PolicyError.from_validation(exc)
    lines = []
    for err in errors[:20]:
        loc = ".".join(str(p) for p in err["loc"] if p not in _CONDITION_TAGS)[:120] or "<policy>"
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


class Rule(StrictModel):
    """When ``when`` holds, take ``action``; ``reason`` is shown to users and auditors.

    ``early_stop``: stop generating as soon as the rule has fired on the prefix (in every entry
    point, streamed or not: the driver watches every generation). Allowed only for conditions
    that cannot un-fire as the answer grows (``>``/``>=`` on ``max_eu``, ``max_au``,
    ``n_tokens``, combined with ``all``/``any``).
    """

    name: str = Field(min_length=1)
    when: Condition
    action: ActionName
    reason: str = ""
    early_stop: bool = False

    @model_validator(mode="after")
    def _early_stop_is_sound(self) -> Rule:
        if self.early_stop and not is_monotone(self.when):
            msg = (
                f"rule {self.name!r}: early_stop needs a condition that cannot un-fire as the answer grows "
                "('>'/'>=' on max_eu, max_au or n_tokens, joined by all/any)"
            )
            raise ValueError(msg)
        return self


class RetrieveSettings(StrictModel):
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
        check_template(v, {"context", "question"}, "context_template", context="c", question="q")
        for name in ("context", "question"):
            if "{" + name + "}" not in v:
                msg = f"context_template must contain {{{name}}}, got {short_repr(v)}"
                raise ValueError(msg)
        return v

    def prompt(self, question: str, passages: Sequence[str]) -> str:
        """The retrieval-augmented user turn: the passages (blank-line separated) and the question."""
        return self.context_template.format(context="\n\n".join(passages), question=question)


class WarnSettings(StrictModel):
    disclaimer: str = "Note: the model was unsure about parts of this answer; please verify it."


class AbstainSettings(StrictModel):
    message: str = "I don't know."


class ReviewSettings(StrictModel):
    message: str = "This answer is waiting for review by a person (review id {review_id})."

    @field_validator("message")
    @classmethod
    def _review_id_only(cls, v: str) -> str:
        return check_template(v, {"review_id"}, "human_review.message", review_id=1)


class QuadrantSettings(StrictModel):
    au_quantile: float = Field(default=0.5, ge=0.0, le=1.0)
    eu_quantile: float = Field(default=0.5, ge=0.0, le=1.0)


class Policy(StrictModel):
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
    tool_calls: ToolCallPolicy = ToolCallPolicy()
    """Rules for the tool calls of an agent's answers, applied before each tool runs
    (:mod:`logtoku_guard.decision.tool_gate.call_policy`; used by ``LogTokUMiddleware``)."""
    second_look: SecondLookSettings = SecondLookSettings()
    """How the second looks are taken (prompt, N, temperature, templates) when a rule reaches their
    statistics (:mod:`logtoku_guard.scoring.second_look`); never taken for a policy whose rules do not read them."""

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
        """Validate ``data`` (at most :data:`~logtoku_guard.decision.policy_loading.MAX_POLICY_NODES` values)."""
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
    def named(cls, name: str) -> Policy:
        """A policy shipped with the library, by name: ``"default"`` (:func:`default_policy`) or one of
        :func:`shipped_policies` (a file in ``logtoku_guard/decision/policies/``)."""
        if name == "default":
            return default_policy()
        names = shipped_policies()
        if name not in names:
            shipped = ", ".join(["default", *names])
            msg = f"no shipped policy named {short_repr(name)}; shipped: {shipped} (or load a file with Policy.from_file)"
            raise PolicyError(msg)
        return cls.from_file(_SHIPPED / f"{name}.yaml")

    @classmethod
    def load(cls, spec: str | Path) -> Policy:
        """What a ``--policy`` option names: a policy file when ``spec`` is an existing file, else a shipped
        policy's name (:meth:`named`: ``"default"`` or one of :func:`shipped_policies`). A bare name that is
        neither is refused naming the shipped ones; a path (a separator or a ``.yaml``/``.yml``/``.json``
        suffix) that is no file gets the file's own error."""
        p = Path(spec)
        if p.is_file():
            return cls.from_file(p)
        name = str(spec)
        if p.suffix.lower() in {".yaml", ".yml", ".json"} or p.name != name or not name:
            return cls.from_file(p)
        if name != "default" and name not in shipped_policies():
            shipped = ", ".join(["default", *shipped_policies()])
            msg = (
                f"policy {short_repr(name)} is neither a file nor a shipped policy; shipped: {shipped} "
                "(or give the path of a YAML or JSON policy file)"
            )
            raise PolicyError(msg)
        return cls.named(name)

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """Load a YAML (``.yaml``/``.yml``) or JSON policy file, within the bounds of
        :mod:`~logtoku_guard.decision.policy_loading` (size, values, nesting, no YAML aliases, UTF-8)."""
        p = Path(path)
        data = read_policy_file(p)
        if not isinstance(data, dict):
            msg = f"policy file {str(p)!r} must hold a mapping at the top level, got {type(data).__name__}"
            raise PolicyError(msg)
        return cls.from_dict(data)

    # -- evaluation -------------------------------------------------------------------------
    def uses_quantiles(self) -> bool:
        return any(c.has_quantile() for r in self.rules for c in comparisons(r.when))

    def actions(self) -> set[str]:
        acts: set[str] = {r.action for r in self.rules} | {self.default_action}
        if "retrieve" in acts:
            acts.add(self.retrieve.fallback)
        return acts

    def stats_used(self) -> set[str]:
        """The statistics the rules read, each comparison's ``fallback`` included."""
        return {stat for r in self.rules for c in comparisons(r.when) for stat in c.stats()}

    def second_look_stats(self) -> set[str]:
        """The second-look statistics the rules read (empty: this policy never takes a second look)."""
        return {s for s in self.stats_used() if s in LOOK_OF}

    def looks_needed(self, stats: ResponseStats, profile: ModelProfile | None = None) -> tuple[Look, ...]:
        """The second looks the decision on ``stats`` needs now: those measuring the statistics of the
        first rule whose firing depends on a second-look statistic not yet measured, where every rule
        before it is settled without firing (:func:`~logtoku_guard.decision.conditions.settled`).
        Empty when the decision is settled: a rule before it fires, or none depends on one."""
        if not self.second_look_stats():
            return ()
        ctx = RuleContext(self.undefined, profile)
        for rule in self.rules:
            fired = settled(rule.when, stats, ctx)
            if fired is None:
                return looks_for(unmeasured(rule.when, stats))
            if fired:
                return ()
        return ()

    def check_profile(self, profile: ModelProfile | None) -> None:
        """Raise :class:`ConfigurationError` now when a quantile threshold cannot be resolved
        against ``profile`` (no profile, or a statistic the profile lacks)."""
        for rule in self.rules:
            for c in comparisons(rule.when):
                c.check_quantiles(profile)

    def decide(self, stats: ResponseStats, profile: ModelProfile | None = None, *, only_early_stop: bool = False) -> Decision:
        """The first rule that fires on ``stats`` (thresholds resolved against ``profile``).

        Undefined statistics follow ``self.undefined`` (see the module docstring); a rule that
        fired on one says so in its reason (``"...; undefined: empty answer"``).
        """
        rules = [r for r in self.rules if r.early_stop] if only_early_stop else self.rules
        fired = first_firing(rules, stats, RuleContext(self.undefined, profile))
        if fired is None:
            return Decision(action=self.default_action, rule=None, reason="no rule fired", checks=(), stats=stats)
        rule, checks = fired
        reason = rule.reason or describe_checks(checks)
        undefined = sorted({c.undefined for c in checks if c.undefined is not None})
        if undefined and rule.reason:
            reason = f"{reason}; " + "; ".join(f"undefined: {u}" for u in undefined)
        return Decision(action=rule.action, rule=rule.name, reason=reason, checks=tuple(checks), stats=stats)


@dataclass(frozen=True)
class Decision:
    """What the policy decided for one answer, and why."""

    action: ActionName
    rule: str | None
    reason: str
    checks: tuple[Check, ...]
    stats: ResponseStats


_SHIPPED = Path(__file__).with_name("policies")


def shipped_policies() -> list[str]:
    """The names of the policies shipped as files (:meth:`Policy.named`), beside ``"default"``."""
    return sorted(p.stem for p in _SHIPPED.glob("*.yaml"))


DEFAULT_COVERAGE = 0.80
DEFAULT_CONFIDENCE = 0.90
"""The default policy's guarantee: it flags answers whose ``guard_score`` (the predicted probability
that the answer is right) is below the threshold that passes at least :data:`DEFAULT_COVERAGE` of
correct answers, with confidence :data:`DEFAULT_CONFIDENCE`, chosen on the profile guard's labelled
out-of-fold scores (:mod:`logtoku_guard.scoring.risk`).

For the embedded model's shipped guard (the tune half of the realistic-traffic benchmark, each
real question asked in two wording styles: 216 correct answers to real questions, out of fold)
that threshold is 0.2797 (coverage lower bound 80.1%, 83.8% observed). On the test half it passed
83.4% [78.0, 88.3] of correct answers (RESULTS.md section 8; the guard there flags 69.0% [64.4,
74.0] of wrong answers, 96.2% [93.1, 98.8] of plausible and 97.4% [94.0, 100] of syllable-name
fabrications at the slightly lower threshold passing 85% on tune). The guarantee is about answers like
the calibration answers; a guard fit on another model's labels (``calibrate --labels``) gets its
own threshold for the same statement; too few labelled correct answers (fewer than 11 at these
settings) cannot support it, and the policy then says so (a
:class:`~logtoku_guard.decision.conditions.RiskTargetWarning` with the best bound it could give) and flags on
its fallback, a quantile of ``reliability``, instead of guessing a guard-score threshold."""

DEFAULT_FLAG_QUANTILE = 0.796
"""Where the default threshold lies in the embedded model's calibration profile; the default
policy flags below this quantile of ``reliability`` when a profile has no fitted guard with
labelled reference scores."""


def default_policy() -> Policy:
    """The calibrated default: flag (retrieve, then abstain) an answer whose ``guard_score`` is below
    the threshold that passes at least :data:`DEFAULT_COVERAGE` of correct answers with confidence
    :data:`DEFAULT_CONFIDENCE`; every other answer passes.

    ``guard_score`` (:mod:`logtoku_guard.scoring.guard_score`) is the profile's learned combination of
    answer and prompt-side statistics, the predicted probability that the answer is right
    (higher = more reliable). Flagged answers go to retrieval, then abstention when still
    uncertain or without a retriever. A profile without a fitted guard (an older version, a
    model with no shipped fit and no ``--labels``, a guard saved without labelled reference scores) flags below quantile
    :data:`DEFAULT_FLAG_QUANTILE` of ``reliability`` instead (``fallback``), a much weaker signal.
    """
    c, conf, q = DEFAULT_COVERAGE, DEFAULT_CONFIDENCE, DEFAULT_FLAG_QUANTILE
    return Policy.from_dict(
        {
            "name": "default",
            "version": "4",
            "description": (
                "retrieve (then abstain) when guard_score, the answer's predicted probability of being right, is below the "
                f"threshold that passes at least {c:.0%} of correct answers with {conf:.0%} confidence on the profile's "
                f"labelled calibration answers (below quantile {q:g} of reliability when the profile has no fitted guard score)"
            ),
            "rules": [
                {
                    "name": "low-guard-score",
                    "when": {
                        "stat": "guard_score",
                        "op": "<",
                        "value": {"coverage": c, "confidence": conf},
                        "fallback": "reliability",
                        "fallback_value": {"quantile": q},
                    },
                    "action": "retrieve",
                },
            ],
            "default_action": "pass",
            "retrieve": {"max_attempts": 1, "fallback": "abstain"},
        }
    )
