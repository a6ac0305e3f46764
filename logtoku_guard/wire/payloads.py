"""The JSON payloads of the library, defined once: token, response summary, decision, guard result.

Every JSON-like form of a score or a decision is built here and nowhere else: the CLI's
``--json``, the audit record, LangChain ``response_metadata`` and custom events, LlamaIndex
``additional_kwargs`` and instrumentation events. Readers (callbacks, the LangGraph review node,
tests) type their reads with these ``TypedDict`` classes instead of ``.get("...")`` on strings.

JSON has no NaN or infinity: every float that is not finite is written as ``None``
(:func:`json_float`). Quadrants: a token whose AU or EU is undefined (raw evidence mode) has
quadrant ``None``; quadrant shares divide by *all* tokens of the answer, so undefined tokens
count in no quadrant (the four shares then sum to less than 1). Both come from
:func:`logtoku_guard.scoring.quadrants.quadrant_of` and :func:`~logtoku_guard.scoring.quadrants.quadrant_shares`,
which :mod:`logtoku_guard.scoring.stats` uses for the policy's ``quadrant_*_share`` statistics too, so
every adapter, payload and policy agrees on both.

Directions: ``au``/``eu`` (and ``*_au``/``*_eu``/``*_share``) higher = more uncertain;
``reliability*`` higher = more reliable.

Flat decision attributes (:func:`decision_attributes`): one set of ``logtoku.*`` keys, built
here only, for the OpenTelemetry GUARDRAIL span, the metadata LangChain tracers get on the
guard's run (``LogTokUGuard`` and ``LogTokUMiddleware``) and their ``logtoku_flagged`` /
``logtoku_retracted`` events, and LlamaIndex's instrument tags. Values are OpenTelemetry
attribute values (strings, numbers, booleans, lists of strings); a key whose value is undefined
is left out, never ``None``:

==================================  ===================================================================
``logtoku.action``                  the decision's action
``logtoku.reason``                  why (the rule's reason, or why no rule fired)
``logtoku.rule``                    the rule that fired (absent when none did)
``logtoku.reliability``             the last answer's reliability (absent when undefined)
``logtoku.guard_score``             the decision's guard score (absent without a fitted guard)
``logtoku.reliability_percentile``  the reliability's percentile (0-100) in the model's profile,
                                    when a profile of the same ``top_n`` is given
``logtoku.attempts``                how many answers were generated
``logtoku.route``                   every action taken, in order: each attempt's own, then the
                                    decision's when it differs (``["retrieve", "pass"]``)
``logtoku.rules``                   the rules that fired on the way, in order, each once
``logtoku.trace_id``                the audit trace id (once concluded)
``logtoku.stopped_early``           an early-stop rule cut the generation (once concluded)
``logtoku.review_id``               the review queue id (``human_review``, once recorded)
==================================  ===================================================================
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from typing_extensions import NotRequired, TypedDict  # pydantic reads these on Python < 3.12 (the wire protocol's extras)

from logtoku_guard.scoring.quadrants import QuadrantThresholds, quadrant_of, quadrant_shares

if TYPE_CHECKING:
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.decision.conditions import Check
    from logtoku_guard.decision.policy import Decision
    from logtoku_guard.decision.results import Attempt, GuardResult
    from logtoku_guard.scoring.stats import ResponseStats
    from logtoku_guard.types import Generation, TokenScore

__all__ = [
    "AttemptPayload",
    "AttributeValue",
    "CheckPayload",
    "DecisionCorePayload",
    "DecisionPayload",
    "GenerationPayload",
    "PolicyPayload",
    "QuadrantLabel",
    "ResultPayload",
    "ServedDecisionPayload",
    "SummaryPayload",
    "ThresholdsPayload",
    "TimingsPayload",
    "TokenPayload",
    "ToolCallDecisionPayload",
    "attempt_payload",
    "check_payload",
    "decision_attributes",
    "decision_core_payload",
    "decision_payload",
    "generation_payload",
    "json_float",
    "result_payload",
    "served_decision_payload",
    "stats_payload",
    "summary_payload",
    "thresholds_payload",
    "token_payload",
]

QuadrantLabel = Literal["I", "II", "III", "IV"]


def json_float(x: float | None) -> float | None:
    """``x`` as a Python float, or ``None`` when it is None, NaN or infinite (JSON has neither)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# -- payload types -----------------------------------------------------------------------------
class _TokenRequired(TypedDict):
    index: int
    token: str
    id: int
    au: float | None
    eu: float | None
    quadrant: QuadrantLabel | None
    logprob: float | None
    entropy: float | None
    top_logits: list[float | None]


class TokenPayload(_TokenRequired, total=False):
    """One generated token: its text, id, AU/EU (higher = more uncertain), quadrant, log p,
    entropy (nats) and the K raw logits (largest first, so anyone can recompute AU/EU).
    ``temperature`` only under dynamic decoding."""

    temperature: float


class ThresholdsPayload(TypedDict):
    """The quadrant thresholds used and where they came from."""

    au: float
    eu: float
    source: str


class TimingsPayload(TypedDict):
    total_s: float
    first_token_s: float | None
    tokens_per_s: float | None


class SummaryPayload(TypedDict):
    """The response-level scores of one generation (``reliability*``: higher = more reliable)."""

    model: str
    reliability: float | None
    reliability_mean: float | None
    probability_reliability: float | None
    entropy_reliability: float | None
    quadrant_shares: dict[str, float] | None
    n_tokens: int
    finish_reason: str
    k: int
    evidence: str
    top_n: int
    prompt_tokens: int
    stop_sequence: str | None
    thresholds: ThresholdsPayload | None
    timings: TimingsPayload


class GenerationPayload(SummaryPayload):
    """A whole generation: what ``logtoku-guard score --json`` prints (summary, text, tokens)."""

    prompt: str
    answer: str
    tokens: list[TokenPayload]


class CheckPayload(TypedDict):
    """One comparison a rule made: ``observed op threshold`` (``observed`` None = undefined, and
    ``undefined`` then says why, e.g. ``"empty answer"``)."""

    stat: str
    op: str
    threshold: float | None
    observed: float | None
    passed: bool
    quantile: float | None
    undefined: str | None
    guarantee: str | None
    """A risk threshold's target, the bound achieved and the data behind it (None: a plain or quantile threshold)."""


class DecisionPayload(TypedDict):
    """What the policy decided for one answer, and why (``stats``: every statistic by name)."""

    action: str
    rule: str | None
    reason: str
    checks: list[CheckPayload]
    stats: dict[str, float | None]


class AttemptPayload(TypedDict):
    """One generation the guard made: its own decision (the route's step), reliability and context."""

    attempt: int
    action: str
    rule: str | None
    reason: str
    reliability: float | None
    n_tokens: int
    passages: int
    retrieval_error: str | None


class PolicyPayload(TypedDict):
    name: str
    version: str


class DecisionCorePayload(TypedDict):
    """What every form of a guarded answer's decision holds (:class:`ResultPayload`, :class:`ServedDecisionPayload`).

    ``route``: every attempt's own decision, in order (``["retrieve", "pass"]`` when retrieval
    rescued the answer); ``rule``/``reason``/``checks``/``stats``: the final decision's.
    """

    action: str
    rule: str | None
    reason: str
    reliability: float | None
    attempts: int
    route: list[AttemptPayload]
    review_id: int | None
    trace_id: str
    stopped_early: bool
    model: str
    policy: PolicyPayload
    checks: list[CheckPayload]
    stats: dict[str, float | None]
    timings: dict[str, float]


class ResultPayload(DecisionCorePayload):
    """A guarded answer: ``logtoku-guard ask --json``, LangChain's ``response_metadata["logtoku_guard"]``
    and LlamaIndex's ``metadata["logtoku"]`` all hold this (adapters may add their own keys).

    ``answer``: what the user gets; ``draft``: the model's last answer before the action; ``tokens``:
    the final generation's tokens.
    """

    answer: str
    draft: str
    tokens: list[TokenPayload]


class ToolCallDecisionPayload(TypedDict):
    """What a served policy's ``tool_calls`` rules decided for one call of the answer (``run``,
    ``human_review`` with its ``review_id``, ``reask``, ``refuse``); ``attempt``: which answer made it."""

    id: str
    name: str
    action: str
    rule: str | None
    reason: str
    review_id: int | None
    attempt: int


class ServedDecisionPayload(DecisionCorePayload):
    """The guard's decision as a client of ``logtoku-guard serve`` sees it (``choices[].logtoku_guard``,
    and ``error.logtoku_guard`` of a ``raise``).

    A :class:`ResultPayload` without what would leak a withheld draft: no ``draft``, no
    ``tokens``, no ``answer`` (the response's content is the answer). ``withheld``: the model's
    draft was not delivered (abstain, human review, raise); ``generated_tokens``: what every
    attempt generated, the guard's own cost beyond the answer's (``usage`` counts the answer);
    ``tool_calls``: what the policy's ``tool_calls`` rules decided for each call.
    """

    withheld: bool
    generated_tokens: int
    tool_calls: NotRequired[list[ToolCallDecisionPayload]]


# -- builders ----------------------------------------------------------------------------------
def thresholds_payload(thresholds: QuadrantThresholds | None) -> ThresholdsPayload | None:
    if thresholds is None:
        return None
    return ThresholdsPayload(au=thresholds.au, eu=thresholds.eu, source=thresholds.source)


def token_payload(token: TokenScore, thresholds: QuadrantThresholds | None = None) -> TokenPayload:
    """One token's JSON form (quadrant ``None`` without thresholds or when AU/EU is undefined)."""
    q = quadrant_of(token, thresholds)
    out = TokenPayload(
        index=token.index,
        token=token.text,
        id=token.id,
        au=json_float(token.au),
        eu=json_float(token.eu),
        quadrant=None if q is None else q.value,
        logprob=json_float(token.logprob),
        entropy=json_float(token.entropy),
        top_logits=[json_float(z) for z in token.top_logits],
    )
    if token.temperature is not None:
        out["temperature"] = token.temperature
    return out


def summary_payload(generation: Generation, thresholds: QuadrantThresholds | None = None) -> SummaryPayload:
    """The response-level summary of one generation."""
    s = generation.score
    return SummaryPayload(
        model=generation.model,
        reliability=json_float(s.reliability),
        reliability_mean=json_float(s.reliability_mean),
        probability_reliability=json_float(s.probability_reliability),
        entropy_reliability=json_float(s.entropy_reliability),
        quadrant_shares=quadrant_shares(generation.tokens, thresholds),
        n_tokens=len(generation.tokens),
        finish_reason=generation.finish_reason,
        k=generation.k,
        evidence=generation.evidence,
        top_n=generation.top_n,
        prompt_tokens=generation.prompt_tokens,
        stop_sequence=generation.stop_sequence,
        thresholds=thresholds_payload(thresholds),
        timings=TimingsPayload(**dataclasses.asdict(generation.timings)),  # type: ignore[typeddict-item]
    )


def generation_payload(generation: Generation, thresholds: QuadrantThresholds | None = None) -> GenerationPayload:
    """A whole generation (summary, prompt, answer, tokens, timings): ``score --json``."""
    summary = summary_payload(generation, thresholds)
    return GenerationPayload(
        **summary,
        prompt=generation.prompt,
        answer=generation.text,
        tokens=[token_payload(t, thresholds) for t in generation.tokens],
    )


def stats_payload(stats: ResponseStats) -> dict[str, float | None]:
    """Every response statistic by name, in :data:`~logtoku_guard.scoring.stats.STAT_NAMES` order (undefined -> ``None``)."""
    return stats.as_dict()


def check_payload(check: Check) -> CheckPayload:
    return CheckPayload(
        stat=check.stat,
        op=check.op,
        threshold=json_float(check.threshold),
        observed=json_float(check.observed),
        passed=check.passed,
        quantile=check.quantile,
        undefined=check.undefined,
        guarantee=check.guarantee,
    )


def decision_payload(decision: Decision) -> DecisionPayload:
    return DecisionPayload(
        action=decision.action,
        rule=decision.rule,
        reason=decision.reason,
        checks=[check_payload(c) for c in decision.checks],
        stats=stats_payload(decision.stats),
    )


def attempt_payload(number: int, attempt: Attempt) -> AttemptPayload:
    """Attempt ``number`` (1 = the first answer) with its own decision."""
    d = attempt.decision
    return AttemptPayload(
        attempt=number,
        action=d.action,
        rule=d.rule,
        reason=d.reason,
        reliability=json_float(attempt.generation.score.reliability),
        n_tokens=len(attempt.generation.tokens),
        passages=len(attempt.passages),
        retrieval_error=attempt.retrieval_error,
    )


def decision_core_payload(result: GuardResult) -> DecisionCorePayload:
    """The fields every form of ``result``'s decision shares (:class:`DecisionCorePayload`)."""
    d = result.decision
    return DecisionCorePayload(
        action=result.action,
        rule=d.rule,
        reason=d.reason,
        reliability=json_float(result.generation.score.reliability),
        attempts=len(result.attempts),
        route=[attempt_payload(i, a) for i, a in enumerate(result.attempts, 1)],
        review_id=result.review_id,
        trace_id=result.trace_id,
        stopped_early=result.stopped_early,
        model=result.generation.model,
        policy=PolicyPayload(name=result.policy_name, version=result.policy_version),
        checks=[check_payload(c) for c in d.checks],
        stats=stats_payload(d.stats),
        timings={k: float(v) for k, v in dataclasses.asdict(result.timings).items()},
    )


def result_payload(result: GuardResult, thresholds: QuadrantThresholds | None = None) -> ResultPayload:
    """A guarded answer with its decision, route and the final generation's tokens."""
    g = result.generation
    return ResultPayload(
        answer=result.answer,
        draft=g.text,
        **decision_core_payload(result),
        tokens=[token_payload(t, thresholds) for t in g.tokens],
    )


def served_decision_payload(result: GuardResult) -> ServedDecisionPayload:
    """:func:`result_payload` less the draft and its tokens: what a served response may carry."""
    return ServedDecisionPayload(
        **decision_core_payload(result),
        withheld=result.withheld,
        generated_tokens=sum(len(a.generation.tokens) for a in result.attempts),
    )


AttributeValue = str | bool | int | float | list[str]
"""A value of :func:`decision_attributes` (an OpenTelemetry attribute value)."""


def decision_attributes(
    decision: Decision,
    attempts: Sequence[Attempt],
    result: GuardResult | None = None,
    profile: ModelProfile | None = None,
) -> dict[str, AttributeValue]:
    """The flat ``logtoku.*`` attributes of ``decision`` after ``attempts`` (the keys: see the module).

    ``result`` (the concluded answer) adds the trace id, ``stopped_early`` and the review id;
    ``profile`` adds the reliability's percentile when it was measured with the same ``top_n``.
    An undefined value (no rule, a NaN reliability) leaves its key out.
    """
    actions: list[str] = [a.decision.action for a in attempts]
    route = actions if actions and actions[-1] == decision.action else [*actions, decision.action]
    rules = [a.decision.rule for a in attempts] + [decision.rule]
    out: dict[str, AttributeValue] = {
        "logtoku.action": decision.action,
        "logtoku.reason": decision.reason,
        "logtoku.attempts": len(attempts),
        "logtoku.route": route,
        "logtoku.rules": list(dict.fromkeys(r for r in rules if r is not None)),
    }
    if decision.rule is not None:
        out["logtoku.rule"] = decision.rule
    guard_score = json_float(decision.stats.as_dict().get("guard_score"))
    if guard_score is not None:
        out["logtoku.guard_score"] = guard_score
    if attempts:
        generation = attempts[-1].generation
        reliability = json_float(generation.score.reliability)
        if reliability is not None:
            out["logtoku.reliability"] = reliability
            if profile is not None and profile.top_n == generation.top_n:
                percentile = json_float(profile.percentile("reliability", reliability))
                if percentile is not None:
                    out["logtoku.reliability_percentile"] = 100.0 * percentile
    if result is not None:
        out["logtoku.trace_id"] = result.trace_id
        out["logtoku.stopped_early"] = result.stopped_early
        if result.review_id is not None:
            out["logtoku.review_id"] = result.review_id
    return out
