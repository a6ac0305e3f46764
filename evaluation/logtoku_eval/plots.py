"""PNG plots (matplotlib, Agg backend: a dependency of logtoku-guard-eval).

* ROC curves of chosen methods;
* risk-coverage curves (error rate of the kept answers vs share kept);
* accuracy against retrieval budget of the end-to-end guards;
* AU/EU scatter of the answers (mean token AU vs mean token EU, K = 2, clamped), coloured by
  correctness, with the quadrant lines at the medians over the answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_eval.metrics import aurc, auroc, risk_coverage, roc_curve
from logtoku_guard.errors import MissingDependencyError


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        msg = "plots need matplotlib (a dependency of logtoku-guard-eval): pip install 'matplotlib>=3.8' (or pass --no-plots)"
        raise MissingDependencyError(msg) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_roc(path: str | Path, scores: Mapping[str, np.ndarray], labels: np.ndarray, title: str) -> Path:
    """ROC curves, one per method, AUROC in the legend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5), dpi=90)
    for name, s in scores.items():
        fpr, tpr = roc_curve(s, labels)
        ax.plot(fpr, tpr, label=f"{name} ({100 * auroc(s, labels):.1f})", lw=1.4)
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set(xlabel="false positive rate (incorrect kept)", ylabel="true positive rate (correct kept)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def plot_risk_coverage(path: str | Path, scores: Mapping[str, np.ndarray], labels: np.ndarray, title: str) -> Path:
    """Risk (error rate of kept answers) against coverage (share kept), AURC in the legend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=90)
    for name, s in scores.items():
        cov, risk = risk_coverage(s, labels)
        ax.plot(cov, risk, label=f"{name} (AURC {aurc(s, labels):.3f})", lw=1.4)
    ax.axhline(float((~labels.astype(bool)).mean()), color="k", ls=":", lw=0.8, label="random")
    ax.set(xlabel="coverage (share of answers kept, most reliable first)", ylabel="risk (error rate of kept)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_au_eu(
    path: str | Path,
    au: np.ndarray,
    eu: np.ndarray,
    labels: np.ndarray,
    title: str,
    names: Sequence[str] = ("correct", "incorrect"),
) -> Path:
    """Answers in the AU/EU plane coloured by correctness; quadrant lines at the medians."""
    plt = _pyplot()
    y = labels.astype(bool)
    ok = np.isfinite(au) & np.isfinite(eu)
    fig, ax = plt.subplots(figsize=(5.5, 4.5), dpi=90)
    ax.scatter(au[ok & y], eu[ok & y], s=12, c="tab:green", alpha=0.7, label=names[0])
    ax.scatter(au[ok & ~y], eu[ok & ~y], s=12, c="tab:red", alpha=0.7, marker="x", label=names[1])
    if ok.any():
        a_mid, e_mid = float(np.median(au[ok])), float(np.median(eu[ok]))
        ax.axvline(a_mid, color="gray", lw=0.8)
        ax.axhline(e_mid, color="gray", lw=0.8)
        for text, x, yy, ha, va in (
            ("I", 0.98, 0.98, "right", "top"),
            ("II", 0.02, 0.98, "left", "top"),
            ("III", 0.02, 0.02, "left", "bottom"),
            ("IV", 0.98, 0.02, "right", "bottom"),
        ):
            ax.text(x, yy, text, transform=ax.transAxes, ha=ha, va=va, fontsize=11, color="gray")
    ax.set(xlabel="mean token AU (K=2)", ylabel="mean token EU (K=2)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="center right")
    return _save(fig, path)


def plot_budget_curves(
    path: str | Path,
    curves: Mapping[str, tuple[np.ndarray, np.ndarray]],
    title: str,
) -> Path:
    """Accuracy against retrieval budget (share of questions sent to retrieval), one line per guard."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=90)
    for name, (budget, accuracy) in curves.items():
        style = ":" if name in ("random", "oracle") else "-"
        ax.plot(budget, 100 * accuracy, style, label=name, lw=1.4)
    ax.set(xlabel="retrieval budget (share of questions retrieved)", ylabel="accuracy of final answers (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_trade_off(
    path: str | Path, curve: Sequence[tuple[float, float, float]], chosen: tuple[float, float] | None, title: str
) -> Path:
    """Share of correct answers passed against share of wrong answers flagged, one point per
    threshold (``curve``: ``(threshold, passed, flagged)``); ``chosen``: the operating point."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=90)
    ax.plot([c[1] for c in curve], [c[2] for c in curve], marker=".", lw=1.2, label="guard_score thresholds")
    if chosen is not None:
        ax.plot([chosen[0]], [chosen[1]], "o", color="C3", label="default policy threshold")
    ax.plot([0, 1], [1, 0], color="k", ls=":", lw=0.8, label="random")
    ax.set(xlabel="correct real answers passed", ylabel="wrong real answers flagged", xlim=(0, 1.02), ylim=(0, 1.02))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p)
    plt.close(fig)
    return p
