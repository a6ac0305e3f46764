"""The QA benchmark harness (TruthfulQA, NQ-open): generate once, then score every method.

Data flow: items -> greedy answers with raw top-5 logits (cached) [+ sampled answers on a
subset (cached)] -> judges label each answer -> every method's reliability, re-scored from
the cache -> metrics with bootstrap intervals -> markdown, JSON, plots.

Methods: the single-pass ones (:func:`~logtoku_eval.methods.single_pass_methods`),
the statistics of ``eval fabricated`` that need no fitted guard (EU maxima, the question's
own log-probability: :func:`~logtoku_eval.crossfit.plain_stat_methods`), per
judge the cross-fitted ``guard-score`` (:func:`~logtoku_eval.crossfit.cross_fit_guard`,
labels depend on the judge; ``guard_folds = 0``: off) and ``guard-score-shipped`` when the
model has a shipped guard; the sampling baselines on a subset. Paired bootstraps: the LogTokU
headline and ``guard-score``, each minus the best baseline.

:func:`run_qa` needs a model only for answers missing from the caches: ``backend`` may be a
zero-argument callable that loads one, and is called only then.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_eval.cache import CachedGeneration, CachedSamples
from logtoku_eval.crossfit import (
    GUARD_SCORE,
    GUARD_SCORE_SHIPPED,
    guard_scores,
    plain_stat_methods,
    plain_stat_scores,
)
from logtoku_eval.datasets import QAItem
from logtoku_eval.fabricated_eval import stats_from_cached
from logtoku_eval.generate import (
    PROMPT_TEMPLATE,
    GreedySpec,
    ProgressFn,
    SamplingSpec,
    greedy_cache,
    run_greedy,
    run_sampling,
    samples_cache,
)
from logtoku_eval.jsonout import write_json
from logtoku_eval.judges import BLEURT_NOTE, Embedder, Judge
from logtoku_eval.methods import (
    HEADLINE,
    SAMPLING_METHODS,
    response_au_eu,
    sampling_scores,
    single_pass_methods,
    single_pass_scores,
)
from logtoku_eval.report import EvalReport, evaluate_methods
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N

DEFAULT_SAMPLES_LIMIT = 50
"""Default subset for the sampling baselines: the first 50 evaluated questions (10 samples
each cost about 10x a greedy pass; ask for more with ``samples_limit``)."""

PLOT_METHODS = (HEADLINE, "guard-score", "logtoku-k2-clamped-mean", "probability-top25", "entropy-top25")


@dataclass(frozen=True)
class QAConfig:
    """Settings of one QA run (``samples_limit = 0``: no sampling baselines; ``guard_folds = 0``:
    no cross-fitted ``guard-score``)."""

    dataset: str
    cache_dir: Path
    out_dir: Path | None = None
    samples_limit: int = DEFAULT_SAMPLES_LIMIT
    greedy: GreedySpec = field(default_factory=GreedySpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    batch_size: int = 8
    n_boot: int = 1000
    seed: int = 0
    top_n: int = DEFAULT_TOP_N
    plots: bool = True
    template: str = PROMPT_TEMPLATE
    semantic_threshold: float = 0.85
    guard_folds: int = 5

    def __post_init__(self) -> None:
        if self.samples_limit < 0:
            msg = f"samples_limit must be >= 0 (0 = no sampling baselines), got {self.samples_limit!r}"
            raise ConfigurationError(msg)
        if self.guard_folds < 0 or self.guard_folds == 1:
            msg = f"guard_folds must be 0 (no cross-fitted guard score) or at least 2, got {self.guard_folds!r}"
            raise ConfigurationError(msg)


@dataclass(frozen=True)
class QARun:
    """What :func:`run_qa` produced: the reports (one per judge) and the files written."""

    reports: tuple[EvalReport, ...]
    files: tuple[Path, ...]
    generations: tuple[CachedGeneration, ...]
    samples: tuple[CachedSamples, ...]


BackendSource = Any
"""A backend, or a zero-argument callable returning one (called only if something is missing)."""


def _resolve(source: BackendSource, holder: list[Any]) -> Any:
    if not holder:
        is_backend = hasattr(source, "batch") and hasattr(source, "k")
        holder.append(source if is_backend else source())
    return holder[0]


def collect(
    items: Sequence[QAItem],
    model: str,
    backend: BackendSource,
    config: QAConfig,
    on_progress: Callable[[str, int, int], ProgressFn] | None = None,
) -> tuple[list[CachedGeneration], list[CachedSamples]]:
    """Fill (or just read) the caches for ``items``; a model is loaded only when something is missing.

    ``on_progress(stage, total, done)`` returns the progress callback of a stage
    (``"greedy"`` / ``"samples"``).
    """
    holder: list[Any] = []
    g_cache = greedy_cache(config.cache_dir, model, config.dataset, config.greedy, template=config.template)
    todo = [it for it in items if it.id not in g_cache]
    if todo:
        progress = on_progress("greedy", len(items), len(items) - len(todo)) if on_progress else None
        run_greedy(
            _resolve(backend, holder), todo, g_cache, spec=config.greedy, batch_size=config.batch_size, on_progress=progress
        )
    generations = g_cache.records([it.id for it in items])
    samples: list[CachedSamples] = []
    if config.samples_limit:
        subset = list(items[: config.samples_limit])
        s_cache = samples_cache(config.cache_dir, model, config.dataset, config.sampling, template=config.template)
        missing = [(i, it) for i, it in enumerate(subset) if it.id not in s_cache]
        if missing:
            progress = on_progress("samples", len(subset), len(subset) - len(missing)) if on_progress else None
            run_sampling(
                _resolve(backend, holder),
                [it for _, it in missing],
                s_cache,
                spec=config.sampling,
                positions=[i for i, _ in missing],
                on_progress=progress,
            )
        samples = s_cache.records([it.id for it in subset])
    return generations, samples


def score_all(
    generations: Sequence[CachedGeneration],
    samples: Sequence[CachedSamples],
    embedder: Embedder | None,
    config: QAConfig,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Single-pass scores of every answer, and every method's scores on the sampling subset."""
    single = single_pass_scores(generations, config.top_n)
    subset: dict[str, np.ndarray] = {}
    if samples:
        n = len(samples)
        subset = {k: v[:n] for k, v in single.items()}
        subset.update(sampling_scores(samples, embedder, config.semantic_threshold))
    return single, subset


def evaluate(
    items: Sequence[QAItem],
    generations: Sequence[CachedGeneration],
    samples: Sequence[CachedSamples],
    judges: Sequence[Judge],
    config: QAConfig,
    *,
    model: str,
    embedder: Embedder | None = None,
    name: str | None = None,
) -> tuple[list[EvalReport], list[Path]]:
    """Label the cached answers with each judge and score every method; write outputs if ``out_dir``."""
    if not judges:
        msg = "give at least one judge (e.g. RougeJudge())"
        raise ConfigurationError(msg)
    by_id = {it.id: it for it in items}
    gens = [g for g in generations if g.id in by_id]
    if len(gens) != len(items):
        msg = f"{len(items) - len(gens)} of {len(items)} questions have no cached answer; run the generation first"
        raise ConfigurationError(msg)
    if samples and [s.id for s in samples] != [g.id for g in gens[: len(samples)]]:
        msg = "the sampled answers must cover the first questions of the evaluated set, in order"
        raise ConfigurationError(msg)
    ordered = [by_id[g.id] for g in gens]
    answers = [g.answer for g in gens]
    single, subset = score_all(gens, samples, embedder, config)
    rows = [stats_from_cached(g, top_n=config.top_n) for g in gens]  # K = 2, clamped: the guard's own statistics
    stats = plain_stat_scores(rows)
    single.update(stats)
    if subset:
        subset.update({k: v[: len(samples)] for k, v in stats.items()})
    methods = [*single_pass_methods(config.top_n), GUARD_SCORE, GUARD_SCORE_SHIPPED, *plain_stat_methods()]
    heads = (HEADLINE, GUARD_SCORE.name)
    title = name or f"{config.dataset} ({model})"
    reports: list[EvalReport] = []
    all_labels: dict[str, np.ndarray] = {}
    per_judge: dict[str, dict[str, np.ndarray]] = {}
    for judge in judges:
        labels = np.array([v.correct for v in judge.judge_many(ordered, answers)], dtype=bool)
        all_labels[judge.name] = labels
        guard, guard_notes, fit = guard_scores(
            rows, labels, model=model, folds=config.guard_folds, seed=config.seed, dataset=f"{config.dataset}, {judge.name}"
        )
        per_judge[judge.name] = guard
        tables = [
            evaluate_methods(
                f"All {len(gens)} questions, single-pass methods",
                methods,
                {**single, **guard},
                labels,
                n_boot=config.n_boot,
                seed=config.seed,
                headline=heads,
            )
        ]
        if subset:
            n = len(samples)
            tables.append(
                evaluate_methods(
                    f"Sampling subset: first {n} questions, {config.sampling.n} samples at T={config.sampling.temperature:g}",
                    [*methods, *SAMPLING_METHODS],
                    {**subset, **{k: v[:n] for k, v in guard.items()}},
                    labels[:n],
                    n_boot=config.n_boot,
                    seed=config.seed,
                    headline=heads,
                )
            )
        reports.append(
            EvalReport(
                name=f"{title}, judge {judge.name}",
                model=model,
                dataset=config.dataset,
                judge=judge.name,
                tables=tuple(tables),
                notes=(*_notes(config, embedder, single), *guard_notes),
                settings={**_settings(config), "guard_crossfit": fit.to_json() if fit else None},
            )
        )
    files: list[Path] = []
    if config.out_dir is not None:
        reports, files = _write(reports, all_labels, gens, single, per_judge, config)
    return reports, files


def _settings(config: QAConfig) -> dict[str, Any]:
    return {
        "prompt": config.template,
        "greedy": config.greedy.name,
        "sampling": config.sampling.name if config.samples_limit else None,
        "samples_limit": config.samples_limit,
        "top_n": config.top_n,
        "n_boot": config.n_boot,
        "seed": config.seed,
        "semantic_threshold": config.semantic_threshold,
        "guard_folds": config.guard_folds,
    }


def _notes(config: QAConfig, embedder: Embedder | None, single: dict[str, np.ndarray]) -> list[str]:
    notes = [BLEURT_NOTE] if config.dataset == "truthfulqa" else []
    notes.append("NaN scores (empty answers; raw evidence outside its domain) are kept and ranked least reliable.")
    if "prompt-mean-logprob" not in single:
        notes.append(
            "No prompt-side statistics: the cache predates prompt scoring "
            "(regenerate into a new generation cache folder: eval --gen-cache-dir)."
        )
    raw_inf = int(np.isinf(single.get("logtoku-k2-raw-top25", np.zeros(0))).sum())
    if raw_inf:
        notes.append(
            f"raw evidence gave an infinite reliability for {raw_inf} answer(s) (a -inf AU token), as the reference code would."
        )
    if config.samples_limit:
        sem = (
            f"embedding clustering with {embedder.name}, cosine >= {config.semantic_threshold:g}"
            if embedder
            else "not run (no embedder)"
        )
        notes.append("semantic-entropy-emb is a STAND-IN for semantic entropy (no entailment model offline): " + sem + ".")
    return notes


def _write(
    reports: list[EvalReport],
    labels: dict[str, np.ndarray],
    gens: Sequence[CachedGeneration],
    single: dict[str, np.ndarray],
    guard: dict[str, dict[str, np.ndarray]],
    config: QAConfig,
) -> tuple[list[EvalReport], list[Path]]:
    out = Path(config.out_dir or ".")
    out.mkdir(parents=True, exist_ok=True)
    stem = config.dataset
    files: list[Path] = []
    plots: list[str] = []
    if config.plots:
        from logtoku_eval.plots import plot_au_eu, plot_risk_coverage, plot_roc

        primary = reports[0].judge
        y = labels[primary]
        scores = {**single, **guard[primary]}
        chosen = {m: scores[m] for m in PLOT_METHODS if m in scores}
        label = f"{config.dataset}, judge {primary}"
        au, eu = response_au_eu(gens)
        for p in (
            plot_roc(out / f"{stem}-roc.png", chosen, y, f"ROC, {label}"),
            plot_risk_coverage(out / f"{stem}-risk-coverage.png", chosen, y, f"Risk-coverage, {label}"),
            plot_au_eu(out / f"{stem}-au-eu.png", au, eu, y, f"Answers in the AU/EU plane, {label}"),
        ):
            files.append(p)
            plots.append(p.name)
        reports = [replace(r, plots=tuple(plots)) for r in reports]
    md = out / f"{stem}.md"
    md.write_text("\n".join(r.to_markdown() for r in reports), encoding="utf-8")
    js = out / f"{stem}.json"
    payload = {
        "reports": [r.to_json() for r in reports],
        "answers": [
            {
                "id": g.id,
                "answer": g.answer,
                "n_tokens": len(g.tokens),
                "labels": {j: bool(v[i]) for j, v in labels.items()},
                "scores": {m: _j(single[m][i]) for m in PLOT_METHODS if m in single},
                "guard_scores": {j: {m: _j(v[i]) for m, v in g.items()} for j, g in guard.items()},
            }
            for i, g in enumerate(gens)
        ],
    }
    write_json(js, payload)
    return reports, [md, js, *files]


def _j(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def run_qa(
    items: Sequence[QAItem],
    model: str,
    backend: BackendSource,
    judges: Sequence[Judge],
    config: QAConfig,
    *,
    embedder: Embedder | None = None,
    on_progress: Callable[[str, int, int], ProgressFn] | None = None,
) -> QARun:
    """Generate what is missing, then evaluate: the whole benchmark in one call."""
    if not items:
        msg = "no questions to evaluate; check the dataset path and --limit"
        raise ConfigurationError(msg)
    generations, samples = collect(items, model, backend, config, on_progress)
    reports, files = evaluate(items, generations, samples, judges, config, model=model, embedder=embedder)
    return QARun(tuple(reports), tuple(files), tuple(generations), tuple(samples))
