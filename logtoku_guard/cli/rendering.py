"""How the CLI shows one scored answer: tokens coloured by AU/EU quadrant, the per-token table, the reliability."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from logtoku_guard.scoring.quadrants import Quadrant, QuadrantThresholds
from logtoku_guard.types import Generation

__all__ = ["QUADRANT_STYLE", "fmt", "render_generation"]

QUADRANT_STYLE = {Quadrant.I: "bold red", Quadrant.II: "bold yellow", Quadrant.III: "green", Quadrant.IV: "cyan"}


def fmt(x: float, digits: int = 4) -> str:
    return "nan" if math.isnan(x) else f"{x:.{digits}f}"


def render_generation(
    generation: Generation, thresholds: QuadrantThresholds, percentile: float | None = None, *, out: Console | None = None
) -> None:
    """Answer with tokens coloured by quadrant, a per-token table and the reliability (on ``out``: stdout by default)."""
    out = out if out is not None else Console()
    answer = Text()
    for t in generation.tokens:
        answer.append(t.text, style=QUADRANT_STYLE[thresholds.classify(t.au, t.eu)])
    out.print(Text("Answer: ", style="bold") + answer)
    table = Table(title=f"Per-token uncertainty (K={generation.k}, {generation.evidence} evidence)", show_lines=False)
    for col, justify in [
        ("#", "right"),
        ("token", "left"),
        ("AU", "right"),
        ("EU", "right"),
        ("AU*EU", "right"),
        ("quadrant", "center"),
        ("log p", "right"),
        ("entropy", "right"),
    ]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for t in generation.tokens:
        q = thresholds.classify(t.au, t.eu)
        table.add_row(
            str(t.index),
            repr(t.text),
            fmt(t.au),
            fmt(t.eu),
            fmt(t.uncertainty),
            Text(q.value, style=QUADRANT_STYLE[q]),
            fmt(t.logprob, 3),
            fmt(t.entropy, 3),
        )
    out.print(table)
    s = generation.score
    out.print(
        f"Response reliability (top-{s.top_n} mean, higher = more reliable): [bold]{fmt(s.reliability)}[/]"
        + (f" (percentile {percentile:.0f} of the model's profile)" if percentile is not None else "")
        + f"   plain mean: {fmt(s.reliability_mean)}   tokens: {s.n_tokens}   finish: {generation.finish_reason}"
    )
    out.print(
        f"Quadrant thresholds AU > {thresholds.au:.4f}, EU > {thresholds.eu:.4f} ({thresholds.source}); "
        + "  ".join(f"[{QUADRANT_STYLE[q]}]{q.value}[/]: {q.description}" for q in Quadrant),
        highlight=False,
    )
