"""``GET /v1/logtoku/reviews/{id}``: a served answer sent to human review, its verdict and released answer.

The id is bounded before anything parses it (an id of thousands of digits names no item), and a
store failure is a 503 (never the item's fault). The ``wait`` long poll holds no thread: it
sleeps on the event loop between reads of the item (:func:`~logtoku_guard.audit.waiting.await_decision`:
reads in a small pool of their own, one read per interval shared by every poll of that item), so
any number of polls leave generation's threads alone, and the route ends it at once when its
client goes away. The withheld draft is sent only once a reviewer approved it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from logtoku_guard.audit.records import parse_review_id
from logtoku_guard.server import wire
from logtoku_guard.wire import openai_protocol as proto

if TYPE_CHECKING:
    from logtoku_guard.audit.records import ReviewItem
    from logtoku_guard.server.engine import Engine

__all__ = ["MAX_REVIEW_WAIT_S", "ReviewQueue", "review_item", "verdict"]


@runtime_checkable
class ReviewQueue(Protocol):
    """What the endpoint reads of the server's store (:class:`~logtoku_guard.audit.AuditStore` is one)."""

    def review_item(self, item_id: int) -> ReviewItem: ...


logger = logging.getLogger(__name__)

MAX_REVIEW_WAIT_S = 60.0
"""Longest ``wait`` of ``GET /v1/logtoku/reviews/{id}`` (a long poll; ask again after it)."""


async def review_item(engine: Engine, review_id: str, wait: float) -> Any:
    """The review item ``review_id`` of ``engine``'s store, after up to ``wait`` seconds for a verdict."""
    import math

    from logtoku_guard.audit.waiting import await_decision
    from logtoku_guard.errors import AuditStoreError, UnknownReviewItemError

    store = engine.store
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
    except AuditStoreError as exc:
        logger.error("review %s: the audit store failed: %s", item_id, exc)
        raise wire.RequestError(503, "the audit store is unreachable; try again later") from exc
    return item


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
