"""``logtoku-guard review ...``: the human-review queue (list, show, claim, approve, reject)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from logtoku_guard.cli import _common
from logtoku_guard.cli._common import StoreOpt
from logtoku_guard.uncertainty import Quadrant

if TYPE_CHECKING:
    from logtoku_guard.audit import ReviewItem

review_app = typer.Typer(help="The human-review queue: list, show, claim, approve, reject.", no_args_is_help=True)

ReviewerOpt = Annotated[str, typer.Option("--reviewer", "-r", help="Who decides (recorded with the verdict).")]


def _item_row(item: ReviewItem) -> dict[str, Any]:
    return {
        "id": item.id,
        "status": item.status,
        "trace_id": item.trace_id,
        "created_at": item.created_at.isoformat(),
        "prompt": item.record.prompt,
        "answer": item.record.answer,
        "reason": item.record.reason,
        "reviewer": item.reviewer,
        "claimed_by": item.claimed_by,
        "edited_answer": item.edited_answer,
        "note": item.note,
    }


@review_app.command("list")
def review_list(store: StoreOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Items waiting for a verdict (pending or claimed), oldest first."""
    items = _common.store_call(store, "pending", include_claimed=True)
    if as_json:
        _common.print_json({"items": [_item_row(i) for i in items]})
        return
    table = Table(title=f"{len(items)} item(s) waiting for review")
    for col in ("id", "status", "created", "question", "reason"):
        table.add_column(col)
    for i in items:
        table.add_row(str(i.id), i.status, i.created_at.strftime("%Y-%m-%d %H:%M"), i.record.prompt[:60], i.record.reason[:60])
    _common.out.print(table)


@review_app.command("show")
def review_show(item_id: Annotated[int, typer.Argument(help="Review item id.")], store: StoreOpt = None) -> None:
    """One item: the question, the answer with tokens marked by quadrant, the decision."""
    item = _common.store_call(store, "review_item", item_id)
    out = _common.out
    out.print(f"[bold]Review {item.id}[/] ({item.status}) trace {item.trace_id}")
    out.print(Text("Question: ", style="bold") + Text(item.record.prompt))
    answer = Text()
    for tok in item.record.tokens:
        q = tok.get("quadrant")  # records are JSON read back from the store: a quadrant label or None
        answer.append(tok["token"], style=_common.QUADRANT_STYLE[Quadrant(q)] if q else "")
    out.print(Text("Answer:   ", style="bold") + answer)
    out.print(f"Action: {item.record.action}; rule: {item.record.rule}; reason: {item.record.reason}", highlight=False)
    if item.status in ("approved", "rejected"):
        out.print(f"Verdict: {item.status} by {item.reviewer}; note: {item.note}; edited answer: {item.edited_answer}")


@review_app.command("claim")
def review_claim(item_id: Annotated[int, typer.Argument()], reviewer: ReviewerOpt, store: StoreOpt = None) -> None:
    """Claim an item so nobody else decides it."""
    item = _common.store_call(store, "claim", item_id, reviewer)
    _common.out.print(f"review {item.id} claimed by {item.claimed_by}")


@review_app.command("approve")
def review_approve(
    item_id: Annotated[int, typer.Argument()],
    reviewer: ReviewerOpt,
    answer: Annotated[str | None, typer.Option(help="An edited answer to release instead.")] = None,
    note: Annotated[str | None, typer.Option(help="A note kept with the verdict.")] = None,
    store: StoreOpt = None,
) -> None:
    """Approve an item (optionally with an edited answer)."""
    item = _common.store_call(store, "approve", item_id, reviewer, edited_answer=answer, note=note)
    _common.out.print(f"review {item.id} approved by {item.reviewer}")


@review_app.command("reject")
def review_reject(
    item_id: Annotated[int, typer.Argument()],
    reviewer: ReviewerOpt,
    note: Annotated[str, typer.Option(help="Why it is rejected (required).")],
    store: StoreOpt = None,
) -> None:
    """Reject an item with a note."""
    item = _common.store_call(store, "reject", item_id, reviewer, note)
    _common.out.print(f"review {item.id} rejected by {item.reviewer}")
