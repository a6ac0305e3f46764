"""Connection limits of the served app: read timeouts for half-sent requests and a cap on open connections.

uvicorn has no timeout for a request that never finishes arriving (its ``timeout_keep_alive``
only closes an idle connection *after* a response), and ``limit_concurrency`` is checked only
once a request's head is complete, so a client sending ``GET /health HTTP/1.1\\r\\nHost: x\\r\\n``
and nothing more holds a socket for ever, and enough of them exhaust the process's file limit
(every ``accept`` then fails, and the event loop logs a traceback per failure).

:func:`limited_protocol` wraps uvicorn's own HTTP protocol class (``http="auto"``: httptools
when installed, else h11) and adds, per connection:

- a **header timeout**: a connection whose request head (request line and headers) is not
  complete ``header_timeout`` seconds after it opened (or after its next request began) is closed;
- a **body timeout**: a request whose body is not complete ``body_timeout`` seconds after its
  head is closed (the app sees the client go away);
- a **cap** on open connections, below the process's ``RLIMIT_NOFILE`` (:func:`connection_cap`
  checks it at start). A new connection over the cap first evicts the oldest connection still
  sending its head (so half-sent sockets cannot lock out real clients); when none is, it gets a
  ``503`` and is closed.

Every closed or refused connection is counted in one rate-limited log line (no traceback), and
:func:`quiet_accept_errors` does the same for the event loop's ``accept`` errors (``EMFILE``).
"""

from __future__ import annotations

import errno
import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from logtoku_guard.errors import ConfigurationError

__all__ = [
    "RESERVED_FILES",
    "ConnectionLimits",
    "connection_cap",
    "limited_protocol",
    "quiet_accept_errors",
]

logger = logging.getLogger("logtoku_guard.server")

RESERVED_FILES = 128
"""Open files kept below ``RLIMIT_NOFILE`` for all but connections (the model, the store, logs, the listening socket)."""

LOG_EVERY_S = 10.0
"""At most one log line per kind of refusal per this many seconds."""

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 55\r\n\r\nthe server has too many open connections; retry shortly"
)


@dataclass(frozen=True)
class ConnectionLimits:
    """``serve``'s connection limits (``--max-connections``, ``--header-timeout``, ``--body-timeout``).

    ``max_connections``: open connections at most (``None``: the process's open-file limit less
    :data:`RESERVED_FILES`); ``header_timeout``: seconds for a request's head to arrive;
    ``body_timeout``: seconds for its body to arrive once the head has.
    """

    max_connections: int | None = None
    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def __post_init__(self) -> None:
        n = self.max_connections
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            msg = f"--max-connections must be a whole number >= 1, got {n!r}; leave it out to use the open-file limit"
            raise ConfigurationError(msg)
        for name, value in (("--header-timeout", self.header_timeout), ("--body-timeout", self.body_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                msg = f"{name} must be a positive finite number of seconds, got {value!r}"
                raise ConfigurationError(msg)


def connection_cap(requested: int | None) -> int:
    """The cap on open connections: ``requested`` if the process may open that many files besides
    :data:`RESERVED_FILES` (raising the soft ``RLIMIT_NOFILE`` up to the hard one when needed),
    else a :class:`ConfigurationError` naming the limit and the fix; ``None``: what the soft limit allows."""
    try:
        import resource
    except ImportError:  # not a POSIX system: no file limit to check against
        return requested or 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    if requested is None:
        if soft == infinite:
            return 65536
        if soft - RESERVED_FILES < 16:
            msg = (
                f"this process may open only {soft} files (ulimit -n), too few to serve: raise it "
                f"(ulimit -n 4096) or pass --max-connections"
            )
            raise ConfigurationError(msg)
        return int(soft - RESERVED_FILES)
    needed = requested + RESERVED_FILES
    if soft != infinite and soft < needed:
        if hard == infinite or hard >= needed:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
            except (ValueError, OSError) as exc:
                logger.debug("could not raise RLIMIT_NOFILE to %d: %s", needed, exc)
            else:
                return requested
        allowed = max(0, min(soft, hard if hard != infinite else soft) - RESERVED_FILES)
        msg = (
            f"--max-connections {requested} needs {needed} open files ({RESERVED_FILES} kept for the model, the store "
            f"and logs), but this process may open {soft} (ulimit -n; hard limit "
            f"{'unlimited' if hard == infinite else hard}): raise the limit (ulimit -n {needed}) "
            f"or pass --max-connections {allowed} or less"
        )
        raise ConfigurationError(msg)
    return requested


class _Counted:
    """One log line at most every ``every`` seconds, with the count since the last line."""

    def __init__(self, message: str, every: float = LOG_EVERY_S) -> None:
        self.message = message
        self.every = every
        self._lock = threading.Lock()
        self._count = 0
        self._last = -math.inf

    def note(self, **fields: Any) -> None:
        with self._lock:
            self._count += 1
            now = time.monotonic()
            if now - self._last < self.every:
                return
            count, self._count, self._last = self._count, 0, now
        logger.warning(self.message.format(count=count, every=self.every, **fields))


def limited_protocol(limits: ConnectionLimits, cap: int) -> type:
    """uvicorn's ``auto`` HTTP protocol class with ``limits`` and at most ``cap`` open connections
    (pass it as ``uvicorn.Config(http=...)``)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol
    reading_heads: OrderedDict[int, Any] = OrderedDict()  # connections still sending a head, oldest first
    refused = _Counted("refused {count} connection(s) over --max-connections {cap} (503) in the last {every:g} s")
    evicted = _Counted(
        "closed {count} connection(s) still sending their request head to make room under --max-connections {cap} "
        "in the last {every:g} s"
    )
    timed_out = _Counted(
        "closed {count} connection(s) that did not send a whole request in time "
        "(--header-timeout {head:g} s, --body-timeout {body:g} s) in the last {every:g} s"
    )

    class LimitedHTTPProtocol(base):
        def connection_made(self, transport: Any) -> None:
            self._ltg_timer: Any = None
            self._ltg_body_of: Any = None
            self._ltg_read: Any = None
            super().connection_made(transport)
            if len(self.connections) > cap:
                if reading_heads:
                    _, oldest = reading_heads.popitem(last=False)
                    oldest._ltg_close()
                    evicted.note(cap=cap)
                else:
                    refused.note(cap=cap)
                    transport.write(_BUSY)
                    transport.close()
                    return
            self._ltg_head()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if self._ltg_timer is None and (cycle is None or cycle.response_complete):
                self._ltg_head()  # the next request on a kept-alive connection
            super().data_received(data)
            self._ltg_progress()

        def connection_lost(self, exc: Exception | None) -> None:
            self._ltg_disarm()
            super().connection_lost(exc)

        # -- the timers -------------------------------------------------------------------
        def _ltg_head(self) -> None:
            self._ltg_arm(limits.header_timeout)
            reading_heads[id(self)] = self

        def _ltg_progress(self) -> None:
            cycle = self.cycle
            if cycle is None or cycle is self._ltg_read or cycle.response_complete:
                return
            reading_heads.pop(id(self), None)  # the head is in
            if not cycle.more_body:
                self._ltg_read = cycle
                self._ltg_disarm()
            elif self._ltg_body_of is not cycle:
                self._ltg_body_of = cycle
                self._ltg_arm(limits.body_timeout)

        def _ltg_arm(self, seconds: float) -> None:
            if self._ltg_timer is not None:
                self._ltg_timer.cancel()
            self._ltg_timer = self.loop.call_later(seconds, self._ltg_timed_out)

        def _ltg_disarm(self) -> None:
            reading_heads.pop(id(self), None)
            if self._ltg_timer is not None:
                self._ltg_timer.cancel()
                self._ltg_timer = None

        def _ltg_timed_out(self) -> None:
            self._ltg_timer = None
            timed_out.note(head=limits.header_timeout, body=limits.body_timeout)
            self._ltg_close()

        def _ltg_close(self) -> None:
            self._ltg_disarm()
            if not self.transport.is_closing():
                self.transport.close()

    LimitedHTTPProtocol.__name__ = LimitedHTTPProtocol.__qualname__ = f"Limited{base.__name__}"
    return LimitedHTTPProtocol


class _AcceptErrors(logging.Filter):
    """The event loop's ``accept`` failures for lack of files: one line per :data:`LOG_EVERY_S`, no traceback."""

    FULL = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

    def __init__(self) -> None:
        super().__init__()
        self.counted = _Counted("{count} connection(s) could not be accepted in the last {every:g} s: {error}")

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, OSError) and exc.errno in self.FULL:
            self.counted.note(error=f"{exc.strerror or exc} (raise ulimit -n, or lower --max-connections)")
            return False
        return True


_ACCEPT_FILTER = _AcceptErrors()


def quiet_accept_errors() -> None:
    """Route the event loop's out-of-files ``accept`` errors through one rate-limited line (idempotent)."""
    log = logging.getLogger("asyncio")
    if _ACCEPT_FILTER not in log.filters:
        log.addFilter(_ACCEPT_FILTER)
