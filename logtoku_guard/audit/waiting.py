"""Waiting for a human verdict: the application side of the review queue.

A guard that sends an answer to a person (action ``human_review``) gets a review id
(``GuardResult.review_id``, ``AuditRecord.review_id``). The application then either polls
:meth:`AuditStore.review_item` itself or blocks on :func:`wait_for_decision` (also
:meth:`AuditStore.wait_for_decision`) until a reviewer approves or rejects the item, in a
terminal (``logtoku-guard review approve``) or on the review web page
(``logtoku-guard review serve``)::

    item = store.wait_for_decision(result.review_id, timeout=600)
    answer = item.final_answer  # the edited answer when the reviewer edited it; None if rejected

Polling reads one row per ``poll_interval`` seconds: cheap for SQLite (WAL readers never block
the writer) and for a server database, and it works across processes and machines.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Protocol

from logtoku_guard.errors import ConfigurationError, ReviewTimeoutError

if TYPE_CHECKING:
    from logtoku_guard.audit.records import ReviewItem

__all__ = ["ReviewReader", "wait_for_decision"]


class ReviewReader(Protocol):
    """What waiting reads from a store (:class:`~logtoku_guard.audit.AuditStore` has it)."""

    def review_item(self, review_id: int) -> ReviewItem: ...


def _seconds(value: object, name: str, *, positive: bool) -> float:
    number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
    if number is None or math.isnan(number) or number < 0 or (positive and number == 0):
        kind = "a positive" if positive else "a non-negative"
        msg = f"{name} must be {kind} number of seconds, got {value!r}"
        raise ConfigurationError(msg)
    return number


def wait_for_decision(store: ReviewReader, review_id: int, *, timeout: float | None, poll_interval: float = 0.5) -> ReviewItem:
    """Block until review item ``review_id`` is approved or rejected; return it.

    ``timeout``: seconds to wait at most (``None``: forever; ``0``: check once). Raises
    :class:`ReviewTimeoutError` (a :class:`~logtoku_guard.errors.ReviewError` and a
    :class:`TimeoutError`) when no verdict arrived in time, and
    :class:`~logtoku_guard.errors.UnknownReviewItemError` at once for an unknown id.
    ``poll_interval``: seconds between two reads of the item.
    """
    if timeout is not None:
        timeout = _seconds(timeout, "timeout", positive=False)
    poll_interval = _seconds(poll_interval, "poll_interval", positive=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        item = store.review_item(review_id)
        if item.decided:
            return item
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                msg = (
                    f"review item {review_id} is still {item.status!r} after {timeout:g} s; "
                    "wait longer (timeout=...), or tell the user the answer is still under review"
                )
                raise ReviewTimeoutError(msg, item)
            time.sleep(min(poll_interval, left))
        else:
            time.sleep(poll_interval)
