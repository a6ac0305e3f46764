"""``logtoku-guard audit ...``: the audit trail of guard decisions (tail, stats, export, purge).

Stored texts are printed through :func:`~logtoku_guard.cli._common.safe_text` (no markup, control
characters shown as escapes). ``export`` writes atomically and never onto the store itself;
``purge`` keeps undecided review items unless ``--include-undecided``, and ``--dry-run`` only counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table

from logtoku_guard.cli import _common
from logtoku_guard.cli._common import StoreOpt, safe_text
from logtoku_guard.errors import ConfigurationError, LogTokUError

if TYPE_CHECKING:
    from logtoku_guard.audit.records import DecisionRow, SkippedRow
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.calibration.drift import Period

MAX_SKIPPED_SHOWN = 20
"""Unreadable rows named one by one on stderr; the rest are counted."""


def report_skipped(skipped: Sequence[SkippedRow]) -> None:
    """One warning line on stderr per stored row a command could not read and left out (its table, id,
    column and value), the first :data:`MAX_SKIPPED_SHOWN` of them, then how many more."""
    for row in skipped[:MAX_SKIPPED_SHOWN]:
        _common.err.print(safe_text(f"warning: skipped an unreadable row: {row.describe()}"), highlight=False)
    if len(skipped) > MAX_SKIPPED_SHOWN:
        more = len(skipped) - MAX_SKIPPED_SHOWN
        _common.err.print(f"warning: ... and {more} more unreadable row(s) skipped", highlight=False)
    if skipped:
        _common.err.print(
            f"warning: {len(skipped)} stored row(s) could not be read and were left out; fix or delete them with SQL",
            highlight=False,
        )


audit_app = typer.Typer(help="The audit trail of guard decisions: tail, stats, export, purge.", no_args_is_help=True)


@audit_app.command("tail")
def audit_tail(
    n: Annotated[int, typer.Option("-n", help="Number of records (0 or more).")] = 20,
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object ({records: [...]}) instead of a table.")] = False,
) -> None:
    """The newest decisions (the store must exist: none is created)."""
    from logtoku_guard.audit.store import MAX_ROWS

    if not 0 <= n <= MAX_ROWS:
        raise _common.fail(ConfigurationError(f"-n {n} is out of range; give a number of records from 0 to {MAX_ROWS}"))
    records = _common.store_read(store, "tail", n)
    report_skipped(records.skipped)
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
        _common.print_json({"records": rows, "skipped": [s.as_json() for s in records.skipped]})
        return
    table = Table(title=f"last {len(records)} decision(s)", box=box.SIMPLE_HEAD)
    for col in ("time", "action", "rule", "reliability", "question"):  # folded, never cut, at 80 columns
        table.add_column(col, overflow="fold", max_width=10 if col == "time" else None)
    for r in records:
        rel = "n/a" if r.reliability is None else f"{r.reliability:.4f}"
        table.add_row(
            r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            safe_text(r.action),
            safe_text(r.rule or "-"),
            rel,
            safe_text(r.prompt[:60]),
        )
    _common.out.print(table)


@audit_app.command("stats")
def audit_stats(
    store: StoreOpt = None,
    by: Annotated[str, typer.Option(help="Group by UTC 'day' or ISO 'week'.")] = "week",
    since: Annotated[str | None, typer.Option(help="Only decisions at or after this ISO date/time (UTC).")] = None,
    profile: Annotated[
        Path | None, typer.Option(help="Profile whose expected flag rate each period is compared with (default: each model's).")
    ] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder of saved profiles.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object ({periods: [...]}) instead of a table.")] = False,
) -> None:
    """Flag rates and guard_score / max_eu quantiles per day or week, against the profile's expected flag rate.

    A period whose expected rate lies outside the observed rate's 95% interval is reported as drift (on stderr).
    """

    from logtoku_guard.calibration import find_profile_for
    from logtoku_guard.calibration.drift import drift_report, expected_flag_rate

    if by not in ("day", "week"):
        raise _common.fail(ConfigurationError(f"--by must be 'day' or 'week', got {by!r}"))
    try:
        when = _common.parse_since(since)
    except ConfigurationError as exc:
        raise _common.fail(exc) from exc
    try:
        explicit = _read_profile(profile) if profile is not None else None
    except ConfigurationError as exc:
        raise _common.fail(exc) from exc
    expected: dict[str, float | None] = {}

    def expect(model: str) -> float | None:
        if model not in expected:
            found = explicit if explicit is not None else (find_profile_for(model, cache_dir=cache_dir) or (None,))[0]
            expected[model] = expected_flag_rate(found)
        return expected[model]

    # Streamed (issue 43): the rows pass once and only counts stay; each quantile is read off a
    # stream the database sorts, so memory stays flat however large the store.
    skipped: list[SkippedRow] = []
    try:
        with _common.open_store(store, read_only=True) as audit:

            def ranked(stat: str, model: str, first: datetime, last: datetime) -> Iterator[DecisionRow]:
                return audit.ranked_decisions(stat, model=model, first=first, last=last)

            periods = drift_report(audit.iter_decisions(when, skipped=skipped), by, expect, ranked)  # type: ignore[arg-type]
    except LogTokUError as exc:
        raise _common.fail(exc) from exc
    report_skipped(skipped)
    if as_json:
        rows = [s.as_json() for s in skipped]
        _common.print_json({"by": by, "periods": [p.as_json() for p in periods], "skipped": rows})
    else:
        _common.out.print(f"{sum(p.n for p in periods)} decision(s) by {by}", highlight=False)
        for model in dict.fromkeys(p.model for p in periods):  # one table per model: fits 80 columns, values whole
            _common.out.print(_stats_table(model, [p for p in periods if p.model == model]))
    for p in periods:
        if (line := p.warning()) is not None:
            _common.err.print(safe_text(line), highlight=False)


def _stats_table(model: str, periods: Sequence[Period]) -> Table:
    """``audit stats``' table of one model: numbers never wrap or get cut, rules one per line."""
    expected = periods[0].expected
    title = safe_text(f"{model}: the profile expects {'-' if expected is None else f'{100 * expected:.0f}%'} flagged")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for col, fits in (("period", True), ("n", True), ("flagged\n[95% CI]", True), ("by rule", False)):
        table.add_column(col, no_wrap=fits, overflow="fold", justify="right" if col == "n" else "left")
    table.add_column("guard_score\nq10 q50 q90", no_wrap=True)
    table.add_column("max_eu\nq50", no_wrap=True)
    for p in periods:
        lo, hi = p.interval
        table.add_row(
            p.period,
            str(p.n),
            f"{100 * p.flag_rate:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]",
            safe_text("\n".join(f"{r} {100 * k / p.n:.0f}%" for r, k in sorted(p.by_rule.items())) or "-"),
            " ".join("-" if v is None else f"{v:.3f}" for v in p.guard_score),
            "-" if p.max_eu[1] is None else f"{p.max_eu[1]:.3f}",
        )
    return table


def _read_profile(path: Path) -> ModelProfile:
    """``--profile``, read like every file option (:func:`~logtoku_guard.files.read_bounded`: a pipe or a
    device is refused before anything is read, a file over the size limit too), then validated; the
    error names the file and the first problem, never the file's content."""
    from pydantic import ValidationError

    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.files import read_bounded_text

    text = read_bounded_text(path, _common.MAX_PROFILE_BYTES, "--profile")
    try:
        return ModelProfile.model_validate_json(text)
    except ValidationError as exc:
        e = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(map(str, e["loc"]))
        problem = "not JSON" if e["type"] == "json_invalid" else (f"{where}: {e['msg'][:200]}" if where else e["msg"][:200])
        msg = f"--profile {str(path)!r} is not a model profile ({problem}); make one with `logtoku-guard calibrate`"
        raise ConfigurationError(msg) from None


@audit_app.command("export")
def audit_export(
    path: Annotated[Path, typer.Argument(help="Output file (written under a temporary name, then renamed).")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv.")] = "jsonl",
    force: Annotated[bool, typer.Option("--force", help="Replace PATH if it exists.")] = False,
    store: StoreOpt = None,
) -> None:
    """Export every record as JSONL or CSV (owner-only file; never onto the store's own files)."""
    if not force and (path.exists() or path.is_symlink()) and not path.is_dir():
        raise _common.fail(
            ConfigurationError(f"cannot export to {path}: the file exists; pass another path, or --force to replace it")
        )
    n = _common.store_read(store, "export", path, fmt, overwrite=force)
    report_skipped(n.skipped)
    left_out = f" ({len(n.skipped)} unreadable row(s) left out)" if n.skipped else ""
    _common.out.print(safe_text(f"{n} record(s) written to {path}{left_out}"), highlight=False)


@audit_app.command("purge")
def audit_purge(
    days: Annotated[float, typer.Option(help="Drop records older than this many days (finite, >= 0).")],
    include_undecided: Annotated[
        bool, typer.Option("--include-undecided", help="Also drop records whose review item is pending or claimed.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be removed.")] = False,
    store: StoreOpt = None,
) -> None:
    """Retention: drop records (and their review items) older than DAYS; undecided reviews are kept."""
    call = _common.store_read if dry_run else _common.store_call
    s = call(store, "purge", days, include_undecided=include_undecided, dry_run=dry_run)
    by_status = ", ".join(f"{status} {k}" for status, k in sorted(s.reviews.items())) or "none"
    verb = "would be removed" if dry_run else "removed"
    lines = [
        f"{s.records} record(s) older than {days:g} day(s) (created before {s.cutoff.isoformat()}) {verb}",
        f"review item(s) {verb}: {sum(s.reviews.values())} ({by_status})",
    ]
    if s.kept_undecided:
        lines.append(
            f"{s.kept_undecided} old record(s) kept: their review item is pending or claimed; "
            "decide them, or pass --include-undecided to drop them too"
        )
    if dry_run:
        lines.append("dry run: nothing was deleted")
    for line in lines:
        _common.out.print(safe_text(line), highlight=False)
