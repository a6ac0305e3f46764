"""The live check: the real :class:`~logtoku_guard.guard.guard.Guard` against the replay.

:func:`live_check` runs the guard with one rule "retrieve when <stat> < t" (one attempt,
then pass) on the first questions of a :class:`~logtoku_eval.replay.Replay`, with
``t`` the replay's threshold at the budget, and counts where its decisions and answers agree
with the replay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from logtoku_eval.cache import CachedGeneration
from logtoku_eval.datasets import QAItem
from logtoku_eval.generate import GreedySpec, ProgressFn
from logtoku_eval.judges import MatchJudge
from logtoku_eval.knowledge_base import RagSetup
from logtoku_eval.replay import CROSS_FITTED, SIGNALS, Replay, json_fields, threshold_for
from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError

__all__ = ["LiveCheck", "live_check"]


@dataclass(frozen=True)
class LiveCheck:
    """The real :class:`~logtoku_guard.guard.guard.Guard` against the replay on the first questions."""

    guard: str
    stat: str
    threshold: float
    n: int
    retrieved_live: int
    retrieved_replay: int
    same_decision: int
    same_answer: int
    accuracy_live: float
    accuracy_replay: float
    max_score_diff: float
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return json_fields(self)


def live_check(
    backend: Backend,
    items: Sequence[QAItem],
    setup: RagSetup,
    replay: Replay,
    closed: Sequence[CachedGeneration],
    rag: Sequence[CachedGeneration],
    *,
    guard: str = "logtoku",
    budget: float = 0.3,
    spec: GreedySpec | None = None,
    on_progress: ProgressFn | None = None,
) -> LiveCheck:
    """Run :class:`Guard` with "retrieve when <stat> < t" on ``items`` (the first questions of the replay).

    ``t`` is the replay's threshold at ``budget`` over all its questions. The backend must
    score as the replay's signal does (K = 2, clamped, for ``logtoku``).
    """
    import time

    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.guard.guard import Guard

    if guard not in SIGNALS or guard in CROSS_FITTED:
        why = " (cross-fitted: one model per fold, no single rule to run)" if guard in CROSS_FITTED else ""
        msg = f"the live check cannot run the guard signal {guard!r}{why}; choose one of {sorted(set(SIGNALS) - CROSS_FITTED)}"
        raise ConfigurationError(msg)
    n = len(items)
    if n > replay.n or [it.id for it in items] != list(replay.ids[:n]):
        msg = "the live check runs on the first questions of the replay, in order"
        raise ConfigurationError(msg)
    stat = SIGNALS[guard][1]
    if guard == "logtoku" and (backend.k, backend.evidence) != (2, "clamped"):
        msg = (
            f"the live check of the LogTokU guard replays the K=2 clamped score, but the backend has "
            f"k={backend.k!r}, evidence={backend.evidence!r}; load it with k=2, clamped"
        )
        raise ConfigurationError(msg)
    mask = replay.mask(guard, budget)
    threshold = threshold_for(replay.scores[guard], mask)
    if not math.isfinite(threshold):
        msg = f"no threshold separates the {round(budget * replay.n)} least reliable answers (tied scores); try another budget"
        raise ConfigurationError(msg)
    policy = Policy.from_dict(
        {
            "name": f"e2e-{guard}",
            "version": "1",
            "rules": [
                {
                    "name": f"retrieve-{guard}",
                    "when": {"stat": stat, "op": "<", "value": threshold},
                    "action": "retrieve",
                    "reason": f"{stat} below the {budget:g} budget threshold",
                }
            ],
            "default_action": "pass",
            "retrieve": {**setup.settings.model_dump(), "max_attempts": 1, "fallback": "pass"},
        }
    )
    runner = Guard(backend, policy, retriever=setup.retriever, options=(spec or GreedySpec()).options())
    judge = MatchJudge()
    retrieved_live = same_decision = same_answer = correct = 0
    diffs: list[float] = []
    start = time.perf_counter()
    for i, item in enumerate(items):
        result = runner.run(setup.user_turn(item))
        did = len(result.attempts) > 1
        first = result.attempts[0].decision.stats.get(stat)
        cached = float(replay.scores[guard][i])
        if math.isfinite(first) and math.isfinite(cached):
            diffs.append(abs(first - cached))
        expected = (rag[i] if mask[i] else closed[i]).answer
        answer = result.answer.strip()
        retrieved_live += did
        same_decision += did == bool(mask[i])
        same_answer += answer == expected
        correct += judge.judge(item, answer).correct
        if on_progress is not None:
            on_progress(1)
    return LiveCheck(
        guard=guard,
        stat=stat,
        threshold=threshold,
        n=n,
        retrieved_live=retrieved_live,
        retrieved_replay=int(mask[:n].sum()),
        same_decision=same_decision,
        same_answer=same_answer,
        accuracy_live=correct / n if n else math.nan,
        accuracy_replay=float(replay.final(mask)[:n].mean()) if n else math.nan,
        max_score_diff=max(diffs) if diffs else math.nan,
        seconds=time.perf_counter() - start,
    )
