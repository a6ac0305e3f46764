"""``logtoku-guard review ...``: the human-review queue (list, show, claim, release, approve, reject).

Every stored text (questions, answers, notes, reviewer names) is printed through
:func:`~logtoku_guard.cli._common.safe_text`: an end user's question cannot inject Rich markup or
terminal escape sequences into a reviewer's console. Claims and verdicts record the operating-
system account running the command (:func:`os_user`) beside the ``--reviewer`` name, which is
free text.
"""

from __future__ import annotations

import getpass
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from logtoku_guard.cli import _common
from logtoku_guard.cli._common import StoreOpt, safe_text
from logtoku_guard.cli.review_serve import add_reviewer
from logtoku_guard.cli.review_serve import serve as review_serve

if TYPE_CHECKING:
    from logtoku_guard.audit import ReviewItem

review_app = typer.Typer(help="The human-review queue: list, show, claim, release, approve, reject.", no_args_is_help=True)

ItemIdArg = Annotated[
    int, typer.Argument(help="The review item's id: the first column of `logtoku-guard review list`.", show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of a table.")]
ReviewerOpt = Annotated[
    str,
    typer.Option("--reviewer", "-r", help="Who decides (recorded with the verdict, beside the OS user running the command)."),
]


def os_user() -> str:
    """The operating-system account running this process, by user id where the OS has one
    (``$USER``/``$LOGNAME`` can be set to anything), else as :func:`getpass.getuser` says."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, AttributeError):
        pass
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


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
        "reviewer_os_user": item.reviewer_os_user,
        "claimed_by": item.claimed_by,
        "claimed_os_user": item.claimed_os_user,
        "edited_answer": item.edited_answer,
        "note": item.note,
    }


def _who(name: str | None, account: str | None) -> str:
    return f"{name} (OS user {account})" if account else f"{name}"


def _say(message: str) -> None:
    _common.out.print(safe_text(message), highlight=False)


@review_app.command("list")
def review_list(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Items waiting for a verdict (pending or claimed), oldest first."""
    from logtoku_guard.cli.audit import report_skipped

    items = _common.store_read(store, "pending", include_claimed=True)
    report_skipped(items.skipped)
    if as_json:
        _common.print_json({"items": [_item_row(i) for i in items], "skipped": [s.as_json() for s in items.skipped]})
        return
    table = Table(title=f"{len(items)} item(s) waiting for review", box=box.SIMPLE_HEAD)
    for col in ("id", "status", "created", "question", "reason"):  # folded, never cut, at 80 columns
        table.add_column(col, overflow="fold", no_wrap=col == "id", min_width=10 if col == "created" else None)
    for i in items:
        table.add_row(
            str(i.id),
            safe_text(i.status if i.claimed_by is None else f"{i.status} by {i.claimed_by}"),
            i.created_at.strftime("%Y-%m-%d %H:%M"),
            safe_text(i.record.prompt[:120]),
            safe_text(i.record.reason[:120]),
        )
    _common.out.print(table)


_STYLE_BY_LABEL: dict[Any, str] = {q.value: style for q, style in _common.QUADRANT_STYLE.items()}


def _heat_map(item: ReviewItem, answer: str) -> Text:
    """The answer's tokens styled by quadrant, if the recorded tokens spell exactly ``answer``."""
    tokens = item.record.tokens
    if not tokens or "".join(str(t.get("token", "")) for t in tokens) != answer:
        return Text("unavailable (the recorded tokens do not spell this answer)", style="dim")
    heat = Text()
    for tok in tokens:
        style = _STYLE_BY_LABEL.get(tok.get("quadrant"), "")  # stored JSON: a quadrant label or None
        heat.append_text(safe_text(tok["token"], style=style))
    return heat


@review_app.command("show")
def review_show(item_id: ItemIdArg, store: StoreOpt = None) -> None:
    """One item: the question, exactly the answer an approval releases, its tokens by quadrant, the decision."""
    item = _common.store_read(store, "review_item", item_id)
    out = _common.out
    out.print(Text(f"Review {item.id}", style="bold") + safe_text(f" ({item.status}) trace {item.trace_id}"))
    out.print(Text("Question: ", style="bold") + safe_text(item.record.prompt))
    released = item.answer_on_approval
    if released is None:
        out.print(Text("Answer (rejected, never released): ", style="bold") + safe_text(item.record.answer))
    else:
        label = "Answer (released): " if item.status == "approved" else "Answer (released if approved): "
        out.print(Text(label, style="bold") + safe_text(released))
        out.print(Text("Tokens:   ", style="bold") + _heat_map(item, released))
    r = item.record
    _say(f"Action: {r.action}; rule: {r.rule}; reason: {r.reason}")
    if item.claimed_by is not None and not item.decided:
        since = item.claimed_at.isoformat() if item.claimed_at else "?"
        _say(f"Claimed by {_who(item.claimed_by, item.claimed_os_user)} since {since}")
    if item.decided:
        _say(
            f"Verdict: {item.status} by {_who(item.reviewer, item.reviewer_os_user)}; note: {item.note}; "
            f"edited answer: {item.edited_answer}"
        )


@review_app.command("claim")
def review_claim(item_id: ItemIdArg, reviewer: ReviewerOpt, store: StoreOpt = None) -> None:
    """Claim an item so nobody else decides it (until released, or until the claim expires)."""
    item = _common.store_call(store, "claim", item_id, reviewer, os_user=os_user())
    _say(f"review {item.id} claimed by {_who(item.claimed_by, item.claimed_os_user)}")


@review_app.command("release")
def review_release(
    item_id: ItemIdArg,
    reviewer: ReviewerOpt,
    force: Annotated[bool, typer.Option("--force", help="Release someone else's claim.")] = False,
    store: StoreOpt = None,
) -> None:
    """Give a claimed item back to the queue (only its claimer, or anyone with --force)."""
    item = _common.store_call(store, "release", item_id, reviewer, force=force)
    _say(f"review {item.id} released by {_who(reviewer, os_user())}; it is pending again")


@review_app.command("approve")
def review_approve(
    item_id: ItemIdArg,
    reviewer: ReviewerOpt,
    answer: Annotated[str | None, typer.Option(help="An edited answer to release instead.")] = None,
    note: Annotated[str | None, typer.Option(help="A note kept with the verdict.")] = None,
    store: StoreOpt = None,
) -> None:
    """Approve an item (optionally with an edited answer)."""
    item = _common.store_call(store, "approve", item_id, reviewer, edited_answer=answer, note=note, os_user=os_user())
    _say(f"review {item.id} approved by {_who(item.reviewer, item.reviewer_os_user)}")


@review_app.command("reject")
def review_reject(
    item_id: ItemIdArg,
    reviewer: ReviewerOpt,
    note: Annotated[str, typer.Option(help="Why it is rejected (required).")],
    store: StoreOpt = None,
) -> None:
    """Reject an item with a note."""
    item = _common.store_call(store, "reject", item_id, reviewer, note, os_user=os_user())
    _say(f"review {item.id} rejected by {_who(item.reviewer, item.reviewer_os_user)}")


review_app.command("serve")(review_serve)  # the review page (logtoku_guard.cli.review_serve)
review_app.command("add-reviewer")(add_reviewer)
