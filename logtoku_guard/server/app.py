"""The ASGI app (FastAPI): :func:`create_app` builds the serving objects once and mounts the routes.

A body is first held to the size and nesting limits (:class:`~logtoku_guard.server.body.BodyLimits`),
then FastAPI parses it into the request models of :mod:`logtoku_guard.wire.openai_protocol` (their
schemas are served at ``GET /openapi.json``, browsable at ``GET /docs``). The routes are
module-level functions, one module per endpoint group (:mod:`logtoku_guard.server.routes`:
``completions``, ``models``, ``reviews``, ``monitoring``), reading the
:class:`~logtoku_guard.server.state.Serving` objects built here once and kept on ``app.state``.
Every refusal is an OpenAI error body with a 4xx status; an API key, when set, is required as
``Authorization: Bearer KEY`` on every ``/v1`` route (``GET /health``, ``/docs`` and
``/openapi.json`` stay open; ``GET /metrics`` as ``--metrics`` says).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logtoku_guard import __version__
from logtoku_guard.server import wire
from logtoku_guard.server.body import TOO_DEEP, BodyLimits, nul_refusal
from logtoku_guard.server.engine import Engine, ThreadRunner
from logtoku_guard.server.settings import ServerSettings, require_serve_extra
from logtoku_guard.server.state import Serving, error_response, serving_of

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend

__all__ = ["close_app", "create_app"]

ROUTES = "GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /v1/logtoku/reviews/{id}"
"""What a 404 lists."""


def create_app(
    settings: ServerSettings | None = None,
    backend: Backend | None = None,
    *,
    engine: Engine | None = None,
    workers: int | None = None,
) -> Any:
    """The FastAPI app serving ``backend`` under the OpenAI/vLLM API, as ``settings`` say.

    The guard (``settings.policy``, ``profile``, ``store``) is built once here, in the
    :class:`~logtoku_guard.server.engine.Engine` over a :class:`ThreadRunner` of ``workers`` threads;
    or pass a ready ``engine`` instead of ``backend`` (its policy, profile and store are then
    the settings', checked as any settings are).
    """
    require_serve_extra()
    from fastapi import FastAPI

    from logtoku_guard.server.routes import completions, models, monitoring, reviews

    settings = settings if settings is not None else ServerSettings()
    if not isinstance(settings, ServerSettings):
        msg = f"create_app's first argument is the ServerSettings, got {type(settings).__name__}; pass an Engine as engine=..."
        raise TypeError(msg)
    if (backend is None) == (engine is None):
        msg = "create_app takes a backend or an engine=... (one of them)"
        raise TypeError(msg)
    store = settings.store
    opened = None  # a store this app opens is this app's to close (at shutdown, or if building fails)
    if isinstance(store, (str, Path)):  # where the store is: opened here, once
        if engine is not None:
            msg = "create_app: give the store to the Engine (engine=Engine(..., store=...)), not a store path beside it"
            raise TypeError(msg)
        from logtoku_guard.audit import AuditStore

        store = opened = AuditStore(store)
        settings = settings.model_copy(update={"store": store})
    try:
        if engine is None:
            engine = Engine(
                ThreadRunner(backend, workers),  # type: ignore[arg-type]  # not None: checked above
                policy=settings.policy,
                profile=settings.profile,
                store=store,
                cache_dir=settings.cache_dir,
            )
        else:
            settings = settings.with_values(policy=engine.policy, profile=engine.profile, store=engine.store)
        serving = Serving.build(settings, engine)
    except BaseException:
        if opened is not None:
            opened.close()
        raise
    app = FastAPI(
        title="logtoku-guard",
        summary="OpenAI-compatible API (log-probabilities, or vLLM's raw logits), plus LogTokU scores and guard decisions.",
        version=__version__,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.serving = serving
    # inside the key check: added first
    app.add_middleware(BodyLimits, max_bytes=settings.max_body_bytes, nul_refused=nul_refusal(engine.store))
    app.middleware("http")(require_api_key)
    app.include_router(monitoring.router)
    if serving.metrics is not None:
        app.include_router(monitoring.metrics_router)
    app.include_router(models.router)
    app.include_router(completions.router)
    app.include_router(reviews.router)
    _add_error_handlers(app)
    app.state.owned_store = opened  # closed by close_app when the server stops
    return app


def close_app(app: Any) -> None:
    """Close what :func:`create_app` opened itself (the store it was given as a path or URL); the
    servers call it when they stop (uvicorn runs here without lifespan events)."""
    state = getattr(app, "state", None)  # any ASGI app may be served; only create_app's own one owns a store
    store = getattr(state, "owned_store", None)
    if store is not None:
        state.owned_store = None  # type: ignore[union-attr]  # found on it
        store.close()


async def require_api_key(request: Any, call_next: Any) -> Any:
    """401 for a ``/v1`` route (and ``/metrics`` under ``--metrics auth``) without the server's key."""
    settings = serving_of(request).settings
    path = request.url.path
    if settings.api_key is not None and (path.startswith("/v1") or (path == "/metrics" and settings.metrics == "auth")):
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), settings.api_key.encode()):
            msg = "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the server's --api-key"
            return error_response(wire.RequestError(401, msg))
    return await call_next(request)


def _add_error_handlers(app: Any) -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, refused)
    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, bad_method)
    app.add_exception_handler(Exception, unexpected)


async def invalid(request: Any, exc: Any) -> Any:
    """A body that does not validate against the OpenAI schema: a 400 naming the field."""
    from logtoku_guard.wire import openai_protocol as proto

    message, param = proto.describe_errors(exc.errors())
    endpoint = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(request.url.path)
    if endpoint is not None:
        serving_of(request).tally(endpoint, time.perf_counter()).refused(400)
    return error_response(wire.RequestError(400, message, param=param))


async def refused(request: Any, exc: Any) -> Any:
    if isinstance(exc.__cause__, RecursionError):  # FastAPI's JSON parser gave up below BodyLimits' depth limit
        return error_response(wire.RequestError(400, TOO_DEEP))
    return error_response(wire.RequestError(exc.status_code, str(exc.detail)))


async def not_found(request: Any, exc: Any) -> Any:
    msg = f"no route {request.method} {request.url.path}; this server has {ROUTES}"
    return error_response(wire.RequestError(404, msg))


async def bad_method(request: Any, exc: Any) -> Any:
    msg = f"{request.method} is not allowed on {request.url.path}"
    return error_response(wire.RequestError(405, msg, kind="method_not_allowed"))


async def unexpected(request: Any, exc: Any) -> Any:
    # Starlette raises the exception again once this answer is sent: the server logs it with its traceback.
    msg = f"internal error while handling {request.method} {request.url.path}: {exc.__class__.__name__}"
    return error_response(wire.RequestError(500, msg))
