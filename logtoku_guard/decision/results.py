"""What a guarded question ends with: each attempt, the timings, the result, and the ``raise`` error.

Below :mod:`logtoku_guard.guard.guard` (which builds them) and everything that reads them (payloads,
audit records, telemetry, the adapters); :class:`GuardRejectedError` lives here, beside the
:class:`GuardResult` it carries, so :mod:`logtoku_guard.errors` stays the bottom layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from logtoku_guard.decision.policy import ActionName, Decision
from logtoku_guard.errors import LogTokUError
from logtoku_guard.scoring.second_look import Measurement
from logtoku_guard.types import Generation

__all__ = ["WITHHOLDING_ACTIONS", "Attempt", "GuardRejectedError", "GuardResult", "GuardTimings"]


@dataclass(frozen=True)
class Attempt:
    """One generation the guard made, with its decision and the context it was given."""

    generation: Generation
    decision: Decision
    passages: tuple[str, ...] = ()
    retrieval_error: str | None = None


@dataclass(frozen=True)
class GuardTimings:
    """Seconds per stage of one guarded question (``second_look_s``: the second looks a rule asked for)."""

    total_s: float
    generation_s: float
    decision_s: float
    retrieval_s: float
    second_look_s: float = 0.0


@dataclass(frozen=True)
class GuardResult:
    """The answer to return and everything that led to it."""

    answer: str
    action: ActionName
    decision: Decision
    attempts: tuple[Attempt, ...]
    trace_id: str
    timings: GuardTimings
    review_id: int | None = None
    stopped_early: bool = False
    policy_name: str = ""
    policy_version: str = ""
    second_looks: tuple[Measurement, ...] = ()
    """Every second look taken for this question (each attempt's, in order): its statistics, cost and
    inputs, never its samples (:mod:`logtoku_guard.scoring.second_look`)."""

    @property
    def second_look_tokens(self) -> int:
        """Tokens the model processed for the second looks (0: none was taken)."""
        return sum(m.tokens for m in self.second_looks)

    @property
    def generation(self) -> Generation:
        """The generation the final decision was made on."""
        return self.attempts[-1].generation

    @property
    def reliability(self) -> float:
        return self.generation.score.reliability

    @property
    def withheld(self) -> bool:
        """The draft does not reach the user (``abstain``, ``human_review``, ``raise``): what a
        client receives must then hold nothing of it (no text, tokens, log-probabilities or counts)."""
        return self.action in WITHHOLDING_ACTIONS


WITHHOLDING_ACTIONS: frozenset[ActionName] = frozenset({"abstain", "human_review", "raise"})
"""Actions whose answer is not the model's draft (``warn`` delivers it with a disclaimer)."""


class GuardRejectedError(LogTokUError):
    """Raised by the policy's ``raise`` action; ``.result`` is the full :class:`GuardResult`."""

    def __init__(self, result: GuardResult) -> None:
        self.result = result
        d = result.decision
        super().__init__(f"the guard rejected the answer (rule {d.rule!r}): {d.reason}")
