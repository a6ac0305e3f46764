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

An async application (the server's ``GET /v1/logtoku/reviews/{id}?wait=``) awaits
:func:`await_decision` instead: it sleeps on the event loop between reads (no thread is held
while it waits, and cancelling it ends it at once), reads the row in a small pool of its own
(:class:`SharedReads`, never AnyIO's default thread limiter), and any number of waiters on one
item share one read per ``poll_interval``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from logtoku_guard.errors import ConfigurationError, ReviewTimeoutError

if TYPE_CHECKING:
    from logtoku_guard.audit.records import ReviewItem

__all__ = ["ReviewReader", "SharedReads", "await_decision", "wait_for_decision"]


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


READ_THREADS = 4
"""Worker threads that read review items for :func:`await_decision` (per event loop), apart from every other pool."""


@dataclass
class _Read:
    store: ReviewReader  # held so that the key's id(store) cannot be reused while the entry lives
    event: Any
    started_at: float
    item: ReviewItem | None = None
    error: BaseException | None = None


@dataclass
class SharedReads:
    """Reads of review items for waiters on one event loop: at most ``threads`` reads at once, in a
    :class:`anyio.CapacityLimiter` of their own, and one read per item per ``fresh`` seconds
    however many wait on it: a read started at or after ``not_before`` (in flight or done) is
    shared, so a waiter's first read is its own (never older than its request) and its later
    ones share reads up to ``fresh`` seconds old."""

    threads: int = READ_THREADS
    fresh: float = 0.5
    _limiter: Any = None
    _reads: dict[tuple[int, int], _Read] = field(default_factory=dict)

    @classmethod
    def current(cls) -> SharedReads:
        """The running event loop's instance (created on first use)."""
        global _SHARED  # one RunVar, made on first use: importing this module needs no anyio
        if _SHARED is None:
            from anyio.lowlevel import RunVar

            _SHARED = RunVar("logtoku_guard_review_reads")
        try:
            shared: SharedReads = _SHARED.get()
        except LookupError:
            shared = cls()
            _SHARED.set(shared)
        return shared

    async def read(self, store: ReviewReader, review_id: int, not_before: float | None = None) -> ReviewItem:
        """``store.review_item(review_id)`` from a read started at or after ``not_before`` (``time.monotonic()``;
        default ``fresh`` seconds ago), shared with the other waiters on that item."""
        import anyio
        import anyio.to_thread

        now = time.monotonic()
        not_before = now - self.fresh if not_before is None else not_before
        key = (id(store), review_id)
        entry = self._reads.get(key)
        if entry is None or entry.started_at < not_before:
            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(self.threads)
            self._prune()
            entry = self._reads[key] = _Read(store, anyio.Event(), now)
            # Shielded: a waiter whose client left still finishes the read the others are waiting on
            # (one row: milliseconds), then ends.
            with anyio.CancelScope(shield=True):
                try:
                    entry.item = await anyio.to_thread.run_sync(store.review_item, review_id, limiter=self._limiter)
                except Exception as exc:  # handed to every waiter of this read, raised below
                    entry.error = exc
                finally:
                    entry.event.set()
        else:
            await entry.event.wait()
        if entry.error is not None:
            raise entry.error
        assert entry.item is not None
        return entry.item

    def _prune(self, keep: int = 1024) -> None:
        if len(self._reads) < keep:
            return
        now = time.monotonic()
        for key in [k for k, e in self._reads.items() if e.event.is_set() and now - e.started_at >= self.fresh]:
            del self._reads[key]


_SHARED: Any = None
"""The :class:`anyio.lowlevel.RunVar` holding each event loop's :class:`SharedReads`."""


async def await_decision(
    store: ReviewReader, review_id: int, *, timeout: float, poll_interval: float = 0.5, reads: SharedReads | None = None
) -> ReviewItem:
    """The review item ``review_id`` once it is decided, or as it stands after ``timeout`` seconds.

    The async form of :func:`wait_for_decision`: it holds no thread while it waits (each read of
    the row runs in ``reads``' own small pool, :meth:`SharedReads.current` by default), ends at
    once when cancelled (the client went away), and returns the item undecided at the timeout
    instead of raising. Raises :class:`~logtoku_guard.errors.UnknownReviewItemError` for an
    unknown id and the store's own errors as they are.
    """
    import anyio

    timeout = _seconds(timeout, "timeout", positive=False)
    poll_interval = _seconds(poll_interval, "poll_interval", positive=True)
    reads = reads or SharedReads.current()
    arrived = time.monotonic()
    deadline = arrived + timeout
    item = await reads.read(store, review_id, not_before=arrived)  # never a read older than the request
    while not item.decided:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        await anyio.sleep(min(poll_interval, left))
        item = await reads.read(store, review_id)  # after the last pause too: a verdict that came during it counts
    return item
