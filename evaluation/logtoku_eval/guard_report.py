"""The guard evaluation's report: markdown, JSON and the accuracy-budget plot."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from logtoku_eval.jsonout import finite_json, write_json
from logtoku_eval.live import LiveCheck
from logtoku_eval.replay import CURVE_BUDGETS, BudgetPoint, Replay

__all__ = ["HEADLINE_BUDGET", "GuardEvalReport", "write_report"]

HEADLINE_BUDGET = 0.3
"""The budget whose paired differences the report states in words (the headline retrieval budget)."""


@dataclass(frozen=True)
class GuardEvalReport:
    """Everything the end-to-end evaluation measured."""

    model: str
    setup: dict[str, Any]
    diagnostics: dict[str, Any]
    points: tuple[BudgetPoint, ...]
    areas: dict[str, float]
    paired: tuple[dict[str, Any], ...]
    live: LiveCheck | None = None
    plots: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The report as strict JSON values: an undefined number is ``None`` (its reason in
        ``diagnostics.undefined`` or the notes)."""
        return finite_json(
            {
                "model": self.model,
                "setup": self.setup,
                "diagnostics": self.diagnostics,
                "points": [p.to_json() for p in self.points],
                "area_under_accuracy_budget": self.areas,
                "paired": list(self.paired),
                "live_check": self.live.to_json() if self.live else None,
                "plots": list(self.plots),
            }
        )

    def to_markdown(self) -> str:
        d, s = self.diagnostics, self.setup
        lines = [
            f"## Guard end to end: NQ-open, {d['n']} questions, knowledge base {s['knowledge_base']} ({self.model})",
            "",
            f"Closed-book accuracy {_pct(d['closed_accuracy'])}; with retrieval for every question "
            f"{_pct(d['rag_accuracy'])} (covered questions {_pct(d['rag_accuracy_covered'])}, uncovered "
            f"{_pct(d['rag_accuracy_uncovered'])}). The gold answer is in the retrieved context for "
            f"{_pct(d['answer_in_context_covered'])} of covered and {_pct(d['answer_in_context_uncovered'])} "
            f"of uncovered questions. Retrieval helps {d['helps']} questions and hurts {d['hurts']}."
            + _undefined(d.get("undefined", {})),
            "",
            "| guard | budget | retrievals | accuracy % [95% CI] | helped | hurt |",
            "|---|---|---|---|---|---|",
        ]
        for p in self.points:
            ci = f" [{100 * p.low:.1f}, {100 * p.high:.1f}]" if math.isfinite(p.low) else ""
            lines.append(
                f"| {p.guard} | {p.budget:g} | {p.retrievals} | {100 * p.accuracy:.2f}{ci} | "
                f"{p.helped if p.guard != 'random' else '-'} | {p.hurt if p.guard != 'random' else '-'} |"
            )
        lines += [
            "",
            "Area under the accuracy-budget curve (mean accuracy over budgets 0..1, step 0.02; higher is better):",
            "",
            "| guard | area % |",
            "|---|---|",
            *[f"| {g} | {100 * a:.2f} |" for g, a in self.areas.items()],
        ]
        if self.paired:
            lines += [
                "",
                "Paired bootstrap of accuracy, one guard minus another at the same budget (same resamples; "
                "against `random`, its expected accuracy on each resample):",
                "",
                "| budget | guard | vs | difference (pts) [95% CI] | p |",
                "|---|---|---|---|---|",
                *[f"| {r['budget']:g} | {r['guard']} | {r['vs']} | {_diff(r)} | {_num(r['p'])} |" for r in self.paired],
            ]
            head = [r for r in self.paired if r["guard"] == "guard-score" and r["budget"] == HEADLINE_BUDGET]
            if head:
                said = "; ".join(f"minus {r['vs']} {_diff(r)} pts (p = {_num(r['p'])})" for r in head)
                lines += ["", f"**At budget {HEADLINE_BUDGET:g}, the guard-score guard {said}.**"]
        if self.live is not None:
            v = self.live
            lines += [
                "",
                f"Live check: the real `Guard` (rule `{v.stat} < {v.threshold:.5g}`, one retrieval, then pass) on the "
                f"first {v.n} questions: same retrieve decision as the replay for {v.same_decision}/{v.n}, same final "
                f"answer for {v.same_answer}/{v.n}; retrievals {v.retrieved_live} live vs {v.retrieved_replay} replayed; "
                f"accuracy {_pct(v.accuracy_live)} live vs {_pct(v.accuracy_replay)} replayed; largest difference of the "
                f"signal between the live guard and the cache re-score {_num(v.max_score_diff, '.2e')}; {v.seconds:.0f} s.",
            ]
        lines += ["", *[f"- {note}" for note in self.setup.get("notes", ())]]
        lines += [f"\n![{p}]({p})" for p in self.plots]
        return "\n".join(lines) + "\n"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "n/a"


def _undefined(reasons: dict[str, str]) -> str:
    """`` n/a (a, b): why.`` for each reason of the undefined diagnostics, or nothing."""
    keys: dict[str, list[str]] = {}
    for key, why in reasons.items():
        keys.setdefault(why, []).append(key)
    return "".join(f" n/a ({', '.join(k)}): {why}." for why, k in keys.items())


def _num(x: float, spec: str = ".3f") -> str:
    return format(x, spec) if math.isfinite(x) else "n/a"


def _diff(r: dict[str, Any]) -> str:
    if not math.isfinite(r["diff"]):
        return "n/a"
    ci = f" [{100 * r['low']:+.2f}, {100 * r['high']:+.2f}]" if math.isfinite(r["low"]) else " [n/a]"
    return f"{100 * r['diff']:+.2f}{ci}"


def write_report(
    report: GuardEvalReport, replay: Replay, out_dir: str | Path, *, plots: bool = True
) -> tuple[GuardEvalReport, list[Path]]:
    """Markdown, JSON and (with ``plots``) the accuracy-budget PNG under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    if plots:
        from logtoku_eval.plots import plot_budget_curves

        curves = {g: (CURVE_BUDGETS, replay.curve(g)) for g in [*replay.scores, "random", "oracle"]}
        png = plot_budget_curves(
            out / "guard-e2e-budget.png", curves, f"Guard end to end, NQ-open, {report.setup['knowledge_base']}"
        )
        files.append(png)
        report = replace(report, plots=(png.name,))
    md, js = out / "guard-e2e.md", out / "guard-e2e.json"
    md.write_text(report.to_markdown(), encoding="utf-8")
    write_json(js, report.to_json())
    return report, [md, js, *files]
