"""Results as typed objects, a markdown table and JSON.

:func:`evaluate_methods` turns per-answer reliabilities and correctness labels into one
:class:`MethodResult` per method (AUROC, AUPRC, PRR, AURC with bootstrap intervals) and a
paired bootstrap of the headline LogTokU score against the best baseline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from logtoku_eval.methods import HEADLINE, Method
from logtoku_eval.metrics import Interval, PairedDifference, bootstrap_all, paired_all


@dataclass(frozen=True)
class MethodResult:
    """One method's metrics on one set of answers (``n_nan`` answers scored NaN, ranked last)."""

    method: Method
    n: int
    n_nan: int
    auroc: Interval
    auprc: Interval
    prr: Interval
    aurc: Interval

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method.name,
            "family": self.method.family,
            "description": self.method.description,
            "n": self.n,
            "n_nan": self.n_nan,
            "auroc": self.auroc.to_json(),
            "auprc": self.auprc.to_json(),
            "prr": self.prr.to_json(),
            "aurc": self.aurc.to_json(),
        }


@dataclass(frozen=True)
class Comparison:
    """Paired bootstrap of ``method`` minus ``baseline`` for AUROC and PRR."""

    method: str
    baseline: str
    auroc: PairedDifference
    prr: PairedDifference

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "baseline": self.baseline, "auroc": self.auroc.to_json(), "prr": self.prr.to_json()}


@dataclass(frozen=True)
class ResultTable:
    """Every method on one subset of answers (e.g. all, or the sampling subset)."""

    title: str
    n: int
    accuracy: float
    results: tuple[MethodResult, ...]
    comparisons: tuple[Comparison, ...]

    def best(self, families: Sequence[str]) -> MethodResult | None:
        pool = [r for r in self.results if r.method.family in families and math.isfinite(r.auroc.value)]
        return max(pool, key=lambda r: r.auroc.value, default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "n": self.n,
            "accuracy": self.accuracy,
            "results": [r.to_json() for r in self.results],
            "comparisons": [c.to_json() for c in self.comparisons],
        }

    def to_markdown(self) -> str:
        lines = [
            f"**{self.title}** (n = {self.n}, accuracy = {self.accuracy:.1%})",
            "",
            "| method | family | AUROC % [95% CI] | AUPRC % [95% CI] | PRR % [95% CI] | AURC ↓ | NaN |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            lines.append(
                f"| {r.method.name} | {r.method.family} | {_pct(r.auroc)} | {_pct(r.auprc)} | {_pct(r.prr)} | "
                f"{_num(r.aurc.value, 3)} | {r.n_nan} |"
            )
        for c in self.comparisons:
            lines.append("")
            lines.append(
                f"Paired bootstrap, {c.method} minus {c.baseline} (best baseline by AUROC): "
                f"AUROC {_signed(c.auroc.diff)} pts [{_signed(c.auroc.low)}, {_signed(c.auroc.high)}], "
                f"p = {_num(c.auroc.p_value, 3)}; PRR {_signed(c.prr.diff)} pts "
                f"[{_signed(c.prr.low)}, {_signed(c.prr.high)}], p = {_num(c.prr.p_value, 3)} "
                f"({c.auroc.n_valid} valid resamples)."
            )
        return "\n".join(lines)


def _num(x: float, digits: int = 2) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}f}"


def _signed(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:+.2f}"


def _pct(iv: Interval) -> str:
    if not math.isfinite(iv.value):
        return "n/a"
    ci = f" [{100 * iv.low:.1f}, {100 * iv.high:.1f}]" if math.isfinite(iv.low) else ""
    return f"{100 * iv.value:.2f}{ci}"


def evaluate_methods(
    title: str,
    methods: Sequence[Method],
    scores: Mapping[str, np.ndarray],
    labels: Sequence[bool] | np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    headline: str | Sequence[str] = HEADLINE,
) -> ResultTable:
    """Metrics with bootstrap CIs for each method in ``methods`` present in ``scores``.

    The paired bootstrap compares each ``headline`` method (one name or several, e.g. the
    LogTokU headline and ``guard-score``) with the baseline of highest AUROC (every
    non-LogTokU method in the table), on the same resamples; a headline absent from
    ``scores`` or NaN for every answer gets no comparison.
    """
    y = np.asarray(labels, dtype=bool)
    results = []
    for m in methods:
        if m.name not in scores:
            continue
        s = np.asarray(scores[m.name], dtype=np.float64)
        iv = bootstrap_all(s, y, n_boot=n_boot, seed=seed)
        results.append(
            MethodResult(
                method=m,
                n=int(s.size),
                n_nan=int(np.isnan(s).sum()),
                auroc=iv["auroc"],
                auprc=iv["auprc"],
                prr=iv["prr"],
                aurc=iv["aurc"],
            )
        )
    table = ResultTable(title, int(y.size), float(y.mean()) if y.size else math.nan, tuple(results), ())
    best = table.best(["single-pass baseline", "sampling baseline"])
    comparisons: list[Comparison] = []
    for head in (headline,) if isinstance(headline, str) else headline:
        if best is None or head not in scores or np.isnan(np.asarray(scores[head], dtype=np.float64)).all():
            continue
        diffs = paired_all(scores[head], scores[best.method.name], y, n_boot=n_boot, seed=seed)
        comparisons.append(Comparison(head, best.method.name, diffs["auroc"], diffs["prr"]))
    return ResultTable(title, table.n, table.accuracy, table.results, tuple(comparisons))


@dataclass(frozen=True)
class EvalReport:
    """One evaluation run: what was run (model, dataset, judge, commands) and its tables."""

    name: str
    model: str
    dataset: str
    judge: str
    tables: tuple[ResultTable, ...]
    notes: tuple[str, ...] = ()
    plots: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "dataset": self.dataset,
            "judge": self.judge,
            "settings": dict(self.settings),
            "notes": list(self.notes),
            "plots": list(self.plots),
            "tables": [t.to_json() for t in self.tables],
        }

    def to_markdown(self) -> str:
        head = [
            f"### {self.name}",
            "",
            f"Model: `{self.model}`; dataset: {self.dataset}; judge: `{self.judge}`. "
            "Scores: higher = more reliable; positive class = correct answer.",
            "",
        ]
        body = []
        for t in self.tables:
            body += [t.to_markdown(), ""]
        tail = [f"- {n}" for n in self.notes]
        if self.plots:
            tail += ["", "Plots: " + ", ".join(f"`{p}`" for p in self.plots)]
        return "\n".join(head + body + tail).rstrip() + "\n"
