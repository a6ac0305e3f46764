"""The guard end to end: accuracy against retrievals spent, on NQ-open.

This module runs the whole evaluation; each step has its own module:

* :mod:`~logtoku_eval.knowledge_base`: the FAQ knowledge base built from NQ-open,
  the retrieval prompt (:class:`RagSetup`) and the retrieval answers' cache;
* :mod:`~logtoku_eval.replay`: every guard at every budget replayed exactly from
  the cached closed-book and retrieval answers (:class:`Replay`);
* :mod:`~logtoku_eval.live`: the real :class:`~logtoku_guard.guard.guard.Guard` on the
  first questions against the replay (:func:`live_check`);
* :mod:`~logtoku_eval.guard_report`: :class:`GuardEvalReport` and
  :func:`write_report` (markdown, JSON, plot).

:func:`evaluate_guard` labels both answer sets and replays every guard with bootstrap
intervals; :func:`run_guard_eval` does everything from the questions (generating what the
caches miss) to the written report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_eval.cache import CachedGeneration
from logtoku_eval.crossfit import cross_fit_guard
from logtoku_eval.datasets import QAItem
from logtoku_eval.fabricated_eval import stats_from_cached
from logtoku_eval.generate import GreedySpec, ProgressFn
from logtoku_eval.guard_report import GuardEvalReport, write_report
from logtoku_eval.judges import MatchJudge
from logtoku_eval.knowledge_base import RagSetup, build_knowledge_base, rag_cache, run_rag
from logtoku_eval.live import live_check
from logtoku_eval.methods import single_pass_scores
from logtoku_eval.metrics import PairedDifference, bootstrap_indices
from logtoku_eval.replay import (
    CROSS_FITTED,
    DEFAULT_BUDGETS,
    PAIRED,
    SIGNALS,
    BudgetPoint,
    Replay,
)
from logtoku_guard.backends.base import Backend
from logtoku_guard.decision.policy import RetrieveSettings
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N

__all__ = ["GuardEvalConfig", "GuardEvalRun", "evaluate_guard", "run_guard_eval"]


def evaluate_guard(
    items: Sequence[QAItem],
    closed: Sequence[CachedGeneration],
    rag: Sequence[CachedGeneration],
    setup: RagSetup,
    *,
    model: str,
    budgets: Sequence[float] = DEFAULT_BUDGETS,
    n_boot: int = 1000,
    seed: int = 0,
    top_n: int = DEFAULT_TOP_N,
    guard_folds: int = 5,
) -> tuple[GuardEvalReport, Replay]:
    """Label both answer sets, replay every guard at every budget, with bootstrap intervals.

    ``guard_folds`` (0 = off): the ``guard-score`` signal, cross-fitted on the closed-book
    answers' labels with that many folds (seed ``seed``).
    """
    if [g.id for g in closed] != [it.id for it in items] or [g.id for g in rag] != [it.id for it in items]:
        msg = "closed-book and retrieval answers must cover the evaluated questions, in order"
        raise ConfigurationError(msg)
    for b in budgets:
        if not 0.0 <= b <= 1.0:
            msg = f"retrieval budgets are shares of the questions in [0, 1], got {b!r}"
            raise ConfigurationError(msg)
    judge = MatchJudge()
    closed_ok = np.array([v.correct for v in judge.judge_many(items, [g.answer for g in closed])], dtype=bool)
    rag_ok = np.array([v.correct for v in judge.judge_many(items, [g.answer for g in rag])], dtype=bool)
    scored = single_pass_scores(closed, top_n)
    fit = None
    if guard_folds:
        rows = [stats_from_cached(g, top_n=top_n) for g in closed]
        fit = cross_fit_guard(rows, closed_ok, folds=guard_folds, seed=seed, dataset="nq-open closed-book, nq-match")
        scored["guard-score"] = fit.scores
    signals = {g: scored[m] for g, (m, _) in SIGNALS.items() if m in scored}
    replay = Replay(tuple(it.id for it in items), closed_ok, rag_ok, signals)
    n = replay.n
    idx = bootstrap_indices(n, n_boot, seed) if n_boot else np.zeros((0, n), dtype=int)
    guards = [*signals, "random", "oracle"]
    points: list[BudgetPoint] = []
    for b in sorted(set(budgets)):
        if b in (0.0, 1.0):  # every guard is the same there
            name = "never retrieve" if b == 0.0 else "always retrieve"
            points.append(replace(replay.point("logtoku", b, idx), guard=name, threshold=math.nan))
        else:
            points.extend(replay.point(g, b, idx) for g in guards)
    areas = {g: float(replay.curve(g).mean()) for g in guards}
    paired = tuple(
        {"budget": b, "guard": g, "vs": other, **_paired_row(replay.paired(g, other, b, idx))}
        for b in sorted(set(budgets))
        if 0.0 < b < 1.0 and n_boot
        for g, other in PAIRED
        if g in guards and other in guards
    )
    covered = np.array([it.id in setup.kb.covered for it in items], dtype=bool)
    # the nq-match judge applied to the retrieved context: a gold answer in it as whole words
    in_context = np.array([judge.judge(it, " ".join(setup.passages(it))).correct for it in items], dtype=bool)
    # a share over the covered (uncovered) questions is undefined when there are none: null in the
    # JSON, n/a in the markdown, and the reason under "undefined"
    undefined: dict[str, str] = {}
    groups = {"covered": covered, "uncovered": ~covered}
    diagnostics: dict[str, Any] = {
        "n": n,
        "closed_accuracy": float(closed_ok.mean()),
        "rag_accuracy": float(rag_ok.mean()),
    }
    for key, values in (("rag_accuracy", rag_ok), ("answer_in_context", in_context)):
        for group, mask in groups.items():
            diagnostics[f"{key}_{group}"] = float(values[mask].mean()) if mask.any() else math.nan
            if not mask.any():
                undefined[f"{key}_{group}"] = (
                    f"no {group} question: the knowledge base ({setup.kb.name}) covers {int(covered.sum())} "
                    f"of the {n} evaluated questions"
                )
    diagnostics |= {
        "helps": int((~closed_ok & rag_ok).sum()),
        "hurts": int((closed_ok & ~rag_ok).sum()),
        "nan_scores": {g: int((~np.isfinite(s)).sum()) for g, s in replay.scores.items()},
        "undefined": undefined,
    }
    settings = {
        "knowledge_base": setup.kb.name,
        "coverage": setup.kb.coverage,
        "passages_in_base": len(setup.kb.passages),
        "covered_questions": int(covered.sum()),
        "retrieved_per_question": setup.settings.passages,
        "retrieval": "BM25 (KeywordRetriever) queried with the user turn",
        "prompt": setup.template,
        "retrieval_prompt": setup.prompt_template,
        "judge": judge.name,
        "signals": {g: m for g, (m, _) in SIGNALS.items() if g in signals},
        "guard_folds": guard_folds,
        "guard_crossfit": fit.to_json() if fit else None,
        "n_boot": n_boot,
        "seed": seed,
        "notes": (
            *([fit.describe("their closed-book nq-match labels")] if fit else []),
            "Budgets are matched in sample: at budget b every signal retrieves for its round(b n) least reliable "
            "closed-book answers; a deployed guard sets the threshold from its calibration profile instead.",
            "random = expected accuracy of retrieving the same number of questions uniformly at random; "
            "oracle = retrieves where retrieval helps first (an upper bound, not a method).",
            "helped = wrong closed-book answer made right by retrieval; hurt = right answer made wrong.",
        ),
    }
    return GuardEvalReport(model, settings, diagnostics, tuple(points), areas, paired), replay


def _paired_row(d: PairedDifference) -> dict[str, float]:
    return {"diff": d.diff, "low": d.low, "high": d.high, "p": d.p_value}


# -- the whole run -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GuardEvalConfig:
    """Settings of :func:`run_guard_eval` (``live = 0``: no live check)."""

    cache_dir: Path
    out_dir: Path | None = None
    coverage: float = 0.7
    kb_seed: int = 0
    settings: RetrieveSettings = field(default_factory=RetrieveSettings)
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    greedy: GreedySpec = field(default_factory=GreedySpec)
    batch_size: int = 8
    n_boot: int = 1000
    seed: int = 0
    live: int = 100
    live_guard: str = "logtoku"
    live_budget: float = 0.3
    plots: bool = True
    guard_folds: int = 5

    def __post_init__(self) -> None:
        if self.live < 0:
            msg = f"live must be >= 0 (questions for the live Guard check; 0 = none), got {self.live!r}"
            raise ConfigurationError(msg)
        live_ok = sorted(set(SIGNALS) - CROSS_FITTED)
        if self.live_guard in CROSS_FITTED:
            msg = f"the live check cannot run {self.live_guard!r} (cross-fitted: one model per fold); choose one of {live_ok}"
            raise ConfigurationError(msg)
        if self.live_guard not in SIGNALS:
            msg = f"unknown live guard signal {self.live_guard!r}; choose one of {live_ok}"
            raise ConfigurationError(msg)
        if self.guard_folds < 0 or self.guard_folds == 1:
            msg = f"guard_folds must be 0 (no guard-score signal) or at least 2, got {self.guard_folds!r}"
            raise ConfigurationError(msg)
        if not 0.0 < self.live_budget < 1.0:
            msg = f"live_budget must be strictly between 0 and 1, got {self.live_budget!r}"
            raise ConfigurationError(msg)


@dataclass(frozen=True)
class GuardEvalRun:
    report: GuardEvalReport
    replay: Replay
    files: tuple[Path, ...]


def run_guard_eval(
    items: Sequence[QAItem],
    pool: Sequence[QAItem],
    model: str,
    backend: Backend | Callable[[], Backend],
    config: GuardEvalConfig,
    *,
    live_backend: Backend | Callable[[], Backend] | None = None,
    on_progress: Callable[[str, int, int], ProgressFn] | None = None,
) -> GuardEvalRun:
    """Closed-book answers (the ``eval nq-open`` cache), retrieval answers, replay, live check, report.

    ``backend`` (or a zero-argument callable returning one) generates what the caches miss,
    with K = 5 stored logits; ``live_backend`` (same kind) runs the live check and must score
    like the live signal (K = 2 for ``logtoku``). Either is loaded only when needed.
    """
    from logtoku_eval.qa import QAConfig, _resolve, collect

    kb = build_knowledge_base(items, pool, config.coverage, config.kb_seed)
    setup = RagSetup(kb, config.settings)
    qa_config = QAConfig(
        dataset="nq-open", cache_dir=config.cache_dir, samples_limit=0, greedy=config.greedy, batch_size=config.batch_size
    )
    holder: list[Any] = []
    closed, _ = collect(items, model, lambda: _resolve(backend, holder), qa_config, on_progress)
    cache = rag_cache(config.cache_dir, model, setup, config.greedy)
    todo = [it for it in items if it.id not in cache]
    if todo:
        progress = on_progress("retrieval", len(items), len(items) - len(todo)) if on_progress else None
        run_rag(
            _resolve(backend, holder), todo, setup, cache, spec=config.greedy, batch_size=config.batch_size, on_progress=progress
        )
    rag = cache.records([it.id for it in items])
    report, replay = evaluate_guard(
        items,
        closed,
        rag,
        setup,
        model=model,
        budgets=config.budgets,
        n_boot=config.n_boot,
        seed=config.seed,
        guard_folds=config.guard_folds,
    )
    if config.live:
        live_items = list(items[: config.live])
        progress = on_progress("live guard", len(live_items), 0) if on_progress else None
        runner = _resolve(live_backend, []) if live_backend is not None else _resolve(backend, holder)
        check = live_check(
            runner,
            live_items,
            setup,
            replay,
            closed,
            rag,
            guard=config.live_guard,
            budget=config.live_budget,
            spec=config.greedy,
            on_progress=progress,
        )
        report = replace(report, live=check)
    files: list[Path] = []
    if config.out_dir is not None:
        report, files = write_report(report, replay, config.out_dir, plots=config.plots)
    return GuardEvalRun(report, replay, tuple(files))
