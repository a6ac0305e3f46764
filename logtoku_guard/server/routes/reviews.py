"""``GET /v1/logtoku/reviews/{id}``: a served answer sent to human review, its verdict and released answer.

The id is bounded before anything parses it (an id of thousands of digits names no item). A store
that cannot be reached is a 503 (never the item's fault; the database's address goes to the log
only); an item whose stored row cannot be read (edited by hand, damaged) is a 422 with
``code: "unreadable_row"`` naming the row and column, never the value it holds (it may be a
withheld draft): asking again will not help until someone repairs the row. The ``wait`` long
poll holds no thread: it sleeps on the event loop between reads of the item
(:func:`~logtoku_guard.audit.waiting.await_decision`: reads in a small pool of their own, one read
per interval shared by every poll of that item), so any number of polls leave generation's
threads alone, and the route ends it at once when its client goes away. The withheld draft is
sent only once a reviewer approved it.
"""

import logging
from typing import Any, Protocol, runtime_checkable

from fastapi import APIRouter, Request
from starlette.responses import Response

from logtoku_guard.audit.records import RecordSink, ReviewItem, parse_review_id
from logtoku_guard.server import wire
from logtoku_guard.server.engine import ClientGone, while_connected
from logtoku_guard.server.sse import json_body
from logtoku_guard.server.state import error_response, serving_of
from logtoku_guard.wire import openai_protocol as proto

__all__ = ["MAX_REVIEW_WAIT_S", "ReviewQueue", "review", "review_item", "router", "verdict"]


@runtime_checkable
class ReviewQueue(Protocol):
    """What the endpoint reads of the server's store (:class:`~logtoku_guard.audit.AuditStore` is one)."""

    def review_item(self, item_id: int) -> ReviewItem: ...


logger = logging.getLogger(__name__)

MAX_REVIEW_WAIT_S = 60.0
"""Longest ``wait`` of ``GET /v1/logtoku/reviews/{id}`` (a long poll; ask again after it)."""


router = APIRouter()


@router.get("/v1/logtoku/reviews/{review_id}", response_model=proto.ReviewVerdict, responses=wire.ERROR_RESPONSES)
async def review(review_id: str, request: Request, wait: float = 0.0) -> Any:
    """A served answer sent to human review (its id is ``logtoku_guard.review_id``): the verdict and the
    released answer; ``wait`` (seconds, at most 60) holds the request until a reviewer decides."""
    store = serving_of(request).engine.store
    try:
        item = await while_connected(request, lambda _: review_item(store, review_id, wait))
    except ClientGone:
        return Response(status_code=499)  # nobody reads it: the client went away
    except wire.RequestError as exc:
        return error_response(exc)
    return Response(json_body(verdict(item)), media_type="application/json")


async def review_item(store: RecordSink | None, review_id: str, wait: float) -> Any:
    """The review item ``review_id`` of the server's ``store``, after up to ``wait`` seconds for a verdict."""
    import math

    from logtoku_guard.audit.waiting import await_decision
    from logtoku_guard.errors import AuditStoreError, UnknownReviewItemError, UnreadableRowError

    if not isinstance(store, ReviewQueue):
        msg = "this server keeps no review queue: start it with --store (a SQLite file or a PostgreSQL URL) and a policy"
        raise wire.RequestError(404, msg)
    if not (math.isfinite(wait) and 0 <= wait <= MAX_REVIEW_WAIT_S):
        msg = f"wait={wait!r} must be a number of seconds from 0 to {MAX_REVIEW_WAIT_S:g} (ask again for a longer wait)"
        raise wire.RequestError(400, msg, param="wait")
    try:
        item_id = parse_review_id(review_id)
    except UnknownReviewItemError as exc:
        raise wire.RequestError(404, str(exc)) from None
    try:
        item = await await_decision(store, item_id, timeout=wait)
    except UnknownReviewItemError:
        raise wire.RequestError(404, f"no review item {item_id} in this server's store") from None
    except UnreadableRowError as exc:  # the row is damaged, the store is fine: not a 503 to retry, nor a 500
        logger.warning("review %s: %s", item_id, exc)
        raise wire.RequestError(422, unreadable_message(item_id, exc), kind="unreadable_row", code="unreadable_row") from None
    except AuditStoreError as exc:
        logger.error("review %s: the audit store failed: %s", item_id, exc)
        raise wire.RequestError(503, "the audit store is unreachable; try again later") from exc
    return item


def unreadable_message(item_id: int, exc: Any) -> str:
    """What the client is told of an unreadable stored row: which row and column, never what it holds."""
    row = exc.row
    return (
        f"review item {item_id} cannot be read: the audit store's {row.table} row {row.row_id} holds a {row.column} "
        f"that cannot be read ({row.problem}); the server's operator must fix or delete that row (other items are unaffected)"
    )


def verdict(item: Any) -> proto.ReviewVerdict:
    return proto.ReviewVerdict(
        object="logtoku.review",  # set, so that the response (its set fields) carries it
        id=item.id,
        trace_id=item.trace_id,
        status=item.status,
        decided=item.decided,
        answer=item.final_answer,
        edited=item.status == "approved" and item.edited_answer is not None,
        reviewer=item.reviewer,
        note=item.note,
        decided_at=item.decided_at.isoformat() if item.decided_at else None,
    )
