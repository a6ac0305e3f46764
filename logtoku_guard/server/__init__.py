"""An OpenAI-compatible HTTP server (``logtoku-guard serve``): OpenAI's wire format, LogTokU extensions.

Layout: the bodies are the pydantic models of :mod:`logtoku_guard.wire.openai_protocol`;
:mod:`~logtoku_guard.server.settings` (:class:`ServerSettings`, every setting checked once, for
``serve`` and the app alike), :mod:`~logtoku_guard.server.wire` (the server's limits, response
bodies; no web framework), :mod:`~logtoku_guard.server.body` (size and JSON depth limits before
parsing), :mod:`~logtoku_guard.server.engine` (generation and guarding off the event loop; the
:class:`Runner` seam a batcher replaces), :mod:`~logtoku_guard.server.app` (the FastAPI app:
:func:`create_app` builds the serving objects once, :mod:`~logtoku_guard.server.state`, and
mounts the routes, module-level functions in :mod:`~logtoku_guard.server.routes`, one module per
endpoint group),
:mod:`~logtoku_guard.server.run` (uvicorn: :func:`run_server`, :class:`BackgroundServer`),
:mod:`~logtoku_guard.server.gate` (the policy's ``tool_calls`` rules on served calls) and
:mod:`~logtoku_guard.server.metrics` (``GET /metrics``). The ``serve`` command is the CLI's
(:mod:`logtoku_guard.cli.serve`): the server never imports the CLI.

Needs the ``serve`` extra (``pip install 'logtoku-guard[serve]'``): FastAPI and uvicorn. They
are imported only when an app is built, so this package imports without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logtoku_guard.server.app import create_app
    from logtoku_guard.server.engine import Engine, Runner, ThreadRunner
    from logtoku_guard.server.run import BackgroundServer, build_app, run_server
    from logtoku_guard.server.settings import ServerSettings
    from logtoku_guard.server.wire import Limits

_LAZY = {
    "ServerSettings": "logtoku_guard.server.settings",
    "create_app": "logtoku_guard.server.app",
    "Engine": "logtoku_guard.server.engine",
    "Runner": "logtoku_guard.server.engine",
    "ThreadRunner": "logtoku_guard.server.engine",
    "BackgroundServer": "logtoku_guard.server.run",
    "build_app": "logtoku_guard.server.run",
    "run_server": "logtoku_guard.server.run",
    "Limits": "logtoku_guard.server.wire",
}

__all__ = [
    "BackgroundServer",
    "Engine",
    "Limits",
    "Runner",
    "ServerSettings",
    "ThreadRunner",
    "build_app",
    "create_app",
    "run_server",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module 'logtoku_guard.server' has no attribute {name!r}"
    raise AttributeError(msg)
