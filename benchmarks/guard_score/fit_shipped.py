"""Fit the shipped guard score of the embedded model (``logtoku_guard/calibration/data/``).

Fits :func:`logtoku_guard.guard_score.fit_guard` on the **tune** half of the known-vs-fabricated
benchmark, from the generation cache that ``logtoku-guard eval fabricated`` fills (never on a
test half), re-scored at K = 2 with clamped evidence, and writes the JSON that
``logtoku-guard calibrate`` (without ``--labels``) puts into the profile.

    python benchmarks/guard_score/fit_shipped.py --cache-dir results/cache
"""

from __future__ import annotations

import argparse

from logtoku_guard.calibration.guard_fit import shipped_guard_path
from logtoku_guard.embedded import EMBEDDED_MODEL
from logtoku_guard.evaluation.fabricated import dataset_name, load_fabricated
from logtoku_guard.evaluation.fabricated_eval import stats_from_cached
from logtoku_guard.evaluation.generate import GreedySpec, greedy_cache
from logtoku_guard.guard_score import fit_guard


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default="results/cache")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cache = greedy_cache(args.cache_dir, EMBEDDED_MODEL, dataset_name(), GreedySpec())
    tune = [it for it in load_fabricated("tune") if it.id in cache]
    rows = [stats_from_cached(cache.get(it.id)) for it in tune]  # type: ignore[arg-type]
    guard = fit_guard(rows, [it.is_known for it in tune], [f"{dataset_name()} tune"], seed=args.seed)
    path = shipped_guard_path(EMBEDDED_MODEL, 2, "clamped")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(guard.model_dump_json(indent=1) + "\n", encoding="utf-8")
    print(f"{len(tune)} of {len(load_fabricated('tune'))} tune questions cached; {guard.describe()}")
    print(f"written: {path}")


if __name__ == "__main__":
    main()
