"""Running the app: :func:`run_server` (blocking, the CLI's) and :class:`BackgroundServer` (a thread).

Both use uvicorn on a socket bound by :func:`bind_socket` first, so a port already in use or out
of range is refused with a clear :class:`~logtoku_guard.errors.ConfigurationError` before
anything announces the server. Shutdown is graceful: on SIGINT/SIGTERM (or
:meth:`BackgroundServer.stop`) the server stops accepting connections and waits up to
``graceful_timeout`` seconds for the requests in flight, streams included, to finish.

Every setting (the address, the grace, the connection limits) is the
:class:`~logtoku_guard.server.settings.ServerSettings`', checked once when they are built.
Connections are held to :class:`~logtoku_guard.server.connections.ConnectionLimits` (header and
body read timeouts, a cap on open connections below the process's open-file limit); refused and
timed-out connections are logged in one rate-limited line.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from logtoku_guard.errors import LogTokUError
from logtoku_guard.server.app import close_app, create_app
from logtoku_guard.server.connections import ConnectionLimits, connection_cap, limited_protocol, quiet_accept_errors
from logtoku_guard.server.settings import ServerSettings, check_graceful_timeout, check_host, is_loopback
from logtoku_guard.sockets import bind_socket

if TYPE_CHECKING:
    from logtoku_guard.audit.records import RecordSink
    from logtoku_guard.backends.base import Backend
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.decision.policy import Policy

__all__ = [
    "BackgroundServer",
    "build_app",
    "check_graceful_timeout",
    "check_host",
    "free_port",
    "is_loopback",
    "run_server",
    "serve_app",
    "url",
]


def url(host: str, port: int) -> str:
    """``http://host:port/v1`` (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def build_app(
    backend: Backend,
    *,
    policy: Policy | None = None,
    profile: ModelProfile | None = None,
    store: RecordSink | None = None,
    settings: ServerSettings | None = None,
    workers: int | None = None,
) -> Any:
    """The ASGI app for ``backend`` (optionally guarded by ``policy``): :func:`create_app` with
    ``policy``, ``profile`` and ``store`` given here in place of the settings' own."""
    settings = (settings or ServerSettings()).with_values(policy=policy, profile=profile, store=store)
    return create_app(settings, backend, workers=workers)


def _config(app: Any, host: str, port: int, graceful_timeout: float, log_level: str, limits: ConnectionLimits, cap: int) -> Any:
    import uvicorn

    quiet_accept_errors()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, round(graceful_timeout)),
        lifespan="off",
        access_log=False,
        http=limited_protocol(limits, cap),
    )


def run_server(
    backend: Backend,
    *,
    host: str | None = None,
    port: int | None = None,
    allow_remote: bool | None = None,
    policy: Policy | None = None,
    profile: ModelProfile | None = None,
    store: RecordSink | None = None,
    settings: ServerSettings | None = None,
    graceful_timeout: float | None = None,
    log_level: str = "info",
    sock: socket.socket | None = None,
    connections: ConnectionLimits | None = None,
) -> None:
    """Serve ``backend`` as ``settings`` say until SIGINT/SIGTERM (then finish the requests in flight).

    The other arguments, when given, replace the settings' own (checked with them, once).
    ``sock``: a socket from :func:`bind_socket` (``serve`` binds it before loading the model);
    by default the settings' ``host:port`` is bound here. The socket is closed when the server stops.
    """
    settings = (settings or ServerSettings()).with_values(
        host=host,
        port=port,
        allow_remote=allow_remote,
        graceful_timeout=graceful_timeout,
        connections=connections,
        policy=policy,
        profile=profile,
        store=store,
    )
    sock = sock or bind_socket(settings.host, settings.port)
    try:
        serve_app(create_app(settings, backend), settings, sock, log_level)
    finally:
        sock.close()


def serve_app(app: Any, settings: ServerSettings, sock: socket.socket, log_level: str = "info") -> None:
    """Run ``app`` on the bound ``sock`` with the settings' shutdown grace and connection limits, until
    SIGINT/SIGTERM (the socket stays open: its owner closes it)."""
    import uvicorn

    config = _config(
        app, settings.host, settings.port, settings.graceful_timeout, log_level, settings.connections, settings.max_connections
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        close_app(app)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    """The server in a daemon thread on ``host:port`` (a free port by default), for tests and benchmarks.

    ``with BackgroundServer(app) as srv: ... srv.base_url`` (``http://127.0.0.1:PORT/v1``);
    leaving the block stops it gracefully (requests in flight finish first).
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int | None = None,
        graceful_timeout: float = 30.0,
        log_level: str = "warning",
        connections: ConnectionLimits | None = None,
    ) -> None:
        import uvicorn

        check_host(host, allow_remote=False)
        check_graceful_timeout(graceful_timeout)
        limits = connections or ConnectionLimits()
        config = _config(app, host, port or 0, graceful_timeout, log_level, limits, connection_cap(limits.max_connections))
        self._sock = bind_socket(host, port or 0)  # bound now: no other process can take the port before start()
        self.app = app
        self.host = host
        self.port = int(self._sock.getsockname()[1])
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, name="logtoku-server", daemon=True
        )

    @property
    def base_url(self) -> str:
        return url(self.host, self.port)

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                msg = f"the server did not start on {self.host}:{self.port} within {timeout} s"
                raise LogTokUError(msg)
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._sock.close()
            close_app(self.app)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
