"""``logtoku-guard audit ...``: the audit trail of guard decisions (tail, export, purge)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from logtoku_guard.cli import _common
from logtoku_guard.cli._common import StoreOpt

audit_app = typer.Typer(help="The audit trail of guard decisions: tail, export, purge.", no_args_is_help=True)


@audit_app.command("tail")
def audit_tail(
    n: Annotated[int, typer.Option("-n", help="Number of records.")] = 20,
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The newest decisions."""
    records = _common.store_call(store, "tail", n)
    if as_json:
        rows = [
            {
                "trace_id": r.trace_id,
                "created_at": r.created_at.isoformat(),
                "action": r.action,
                "rule": r.rule,
                "reliability": r.reliability,
                "prompt": r.prompt,
                "answer": r.answer,
                "reason": r.reason,
            }
            for r in records
        ]
        _common.print_json({"records": rows})
        return
    table = Table(title=f"last {len(records)} decision(s)")
    for col in ("time", "action", "rule", "reliability", "question"):
        table.add_column(col)
    for r in records:
        rel = "n/a" if r.reliability is None else f"{r.reliability:.4f}"
        table.add_row(r.created_at.strftime("%Y-%m-%d %H:%M:%S"), r.action, r.rule or "-", rel, r.prompt[:60])
    _common.out.print(table)


@audit_app.command("export")
def audit_export(
    path: Annotated[Path, typer.Argument(help="Output file.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv.")] = "jsonl",
    store: StoreOpt = None,
) -> None:
    """Export every record as JSONL or CSV."""
    n = _common.store_call(store, "export", path, fmt)
    _common.out.print(f"{n} record(s) written to {path}")


@audit_app.command("purge")
def audit_purge(
    days: Annotated[float, typer.Option(help="Drop records older than this many days.")],
    store: StoreOpt = None,
) -> None:
    """Retention: drop records (and their review items) older than DAYS."""
    n = _common.store_call(store, "purge_older_than", days)
    _common.out.print(f"{n} record(s) older than {days:g} day(s) removed")
