"""Cross-fitted guard score on an open-QA cache (NQ-open with nq-match, TruthfulQA with the embedding judge).

Each question's guard_score comes from a model fit on the other folds of that dataset plus the
fabricated tune half (never on the question itself); AUROC with bootstrap CI and the paired
difference against the best single-pass baseline, on the cached answers.

    python benchmarks/guard_score/qa_crossfit.py --dataset nq-open --limit 200 --cache-dir /work/cache/results
"""

from __future__ import annotations

import argparse

import numpy as np

from logtoku_guard.embedded import EMBEDDED_MODEL
from logtoku_guard.evaluation.datasets import load_nq_open, load_truthfulqa
from logtoku_guard.evaluation.fabricated import dataset_name, load_fabricated
from logtoku_guard.evaluation.fabricated_eval import STAT_METHODS, stats_from_cached
from logtoku_guard.evaluation.generate import GreedySpec, greedy_cache
from logtoku_guard.evaluation.methods import single_pass_methods, single_pass_scores
from logtoku_guard.evaluation.report import evaluate_methods
from logtoku_guard.guard_score import fit_guard, with_guard_score


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", choices=["nq-open", "truthfulqa"], default="nq-open")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--cache-dir", default="results/cache")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--n-boot", type=int, default=1000)
    args = ap.parse_args()
    if args.dataset == "nq-open":
        from logtoku_guard.evaluation.judges import MatchJudge

        items, judge = load_nq_open(None)[: args.limit], MatchJudge()
    else:
        from logtoku_guard.evaluation.judges import EmbeddingJudge, TransformerEmbedder

        items, judge = load_truthfulqa(None, limit=args.limit), EmbeddingJudge(TransformerEmbedder())
    cache = greedy_cache(args.cache_dir, EMBEDDED_MODEL, args.dataset, GreedySpec())
    items = [it for it in items if it.id in cache]
    recs = [cache.get(it.id) for it in items]
    labels = np.array([v.correct for v in judge.judge_many(items, [r.answer for r in recs])], dtype=bool)
    rows = [stats_from_cached(r) for r in recs]
    fab_cache = greedy_cache(args.cache_dir, EMBEDDED_MODEL, dataset_name(), GreedySpec())
    tune = [it for it in load_fabricated("tune") if it.id in fab_cache]
    fab_rows = [stats_from_cached(fab_cache.get(it.id)) for it in tune]
    fab_y = [it.is_known for it in tune]
    fold = np.random.default_rng(0).permutation(len(rows)) % args.folds
    guard_scores = np.empty(len(rows))
    for f in range(args.folds):
        train = [i for i in range(len(rows)) if fold[i] != f]
        g = fit_guard(
            [rows[i] for i in train] + fab_rows,
            [bool(labels[i]) for i in train] + fab_y,
            [args.dataset, "fabricated-tune"],
            folds=0,
        )
        for i in np.flatnonzero(fold == f):
            guard_scores[i] = with_guard_score(rows[i], g).guard_score
    scores = {**single_pass_scores(recs), "guard-score": guard_scores}
    scores.update(
        {
            m.name: np.array([s * r.get(st) for r in rows])
            for m, st, s in STAT_METHODS
            if m.name not in ("guard-score", "reliability-debiased")
        }
    )
    methods = [m for m, _, _ in STAT_METHODS] + single_pass_methods()
    title = f"{args.dataset}, first {len(rows)} cached questions, judge {judge.name}, cross-fitted guard score"
    print(evaluate_methods(title, methods, scores, labels, n_boot=args.n_boot, headline="guard-score").to_markdown())


if __name__ == "__main__":
    main()
