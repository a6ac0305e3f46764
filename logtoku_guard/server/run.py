"""Running the app: :func:`run_server` (blocking, the CLI's) and :class:`BackgroundServer` (a thread).

Both use uvicorn. Shutdown is graceful: on SIGINT/SIGTERM (or :meth:`BackgroundServer.stop`)
the server stops accepting connections and waits up to ``graceful_timeout`` seconds for the
requests in flight, streams included, to finish.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Any

from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.server.app import ServerSettings, create_app
from logtoku_guard.server.engine import Engine, ThreadRunner

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool) -> str:
    """``host`` if it is a loopback address or ``allow_remote``; raise otherwise."""
    if not is_loopback(host) and not allow_remote:
        msg = (
            f"host {host!r} would expose the server beyond this machine; bind to 127.0.0.1 (the default), "
            "or pass --allow-remote (and set --api-key) to serve other machines"
        )
        raise ConfigurationError(msg)
    return host


def build_app(
    backend: Any,
    *,
    policy: Any = None,
    profile: Any = None,
    store: Any = None,
    settings: ServerSettings | None = None,
    workers: int | None = None,
) -> Any:
    """The ASGI app for ``backend`` (optionally guarded by ``policy``)."""
    engine = Engine(ThreadRunner(backend, workers), policy=policy, profile=profile, store=store)
    return create_app(engine, settings)


def _config(app: Any, host: str, port: int, graceful_timeout: float, log_level: str) -> Any:
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, round(graceful_timeout)),
        lifespan="off",
        access_log=False,
    )


def run_server(
    backend: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    allow_remote: bool = False,
    policy: Any = None,
    profile: Any = None,
    store: Any = None,
    settings: ServerSettings | None = None,
    graceful_timeout: float = 30.0,
    log_level: str = "info",
) -> None:
    """Serve ``backend`` until SIGINT/SIGTERM (then finish the requests in flight)."""
    import uvicorn

    check_host(host, allow_remote)
    app = build_app(backend, policy=policy, profile=profile, store=store, settings=settings)
    uvicorn.Server(_config(app, host, port, graceful_timeout, log_level)).run()


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
    ) -> None:
        import uvicorn

        check_host(host, allow_remote=False)
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(_config(app, host, self.port, graceful_timeout, log_level))
        self._thread = threading.Thread(target=self.server.run, name="logtoku-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

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

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
