"""The ASGI app (FastAPI): ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``.

A body is first held to the size and nesting limits (:class:`~logtoku_guard.server.body.BodyLimits`),
then FastAPI parses it into the request models of :mod:`logtoku_guard.wire.openai_protocol` (their
schemas are served at ``GET /openapi.json``, browsable at ``GET /docs``); the server's own
limits are checked by :mod:`logtoku_guard.server.wire` and generation runs through
:class:`~logtoku_guard.server.engine.Engine`. Every refusal is an OpenAI error body with a 4xx
status; an API key, when set, is required as ``Authorization: Bearer KEY`` on every ``/v1``
route (``GET /health``, ``/docs`` and ``/openapi.json`` stay open).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at runtime.

import logging
import secrets
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from logtoku_guard import __version__
from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import AuditStoreError, ConfigurationError, LogTokUError, MissingDependencyError
from logtoku_guard.server import gate, refusal, reviews, sse, tools, wire
from logtoku_guard.server.body import TOO_DEEP, BodyLimits, nul_refusal
from logtoku_guard.server.engine import ClientGone, Engine, while_connected
from logtoku_guard.server.metrics import Tally, require_metrics_extra
from logtoku_guard.wire import openai_protocol as proto

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    """Request limits and access: ``api_key`` (None = open), ``max_body_bytes``, ``limits``."""

    api_key: str | None = None
    max_body_bytes: int = 1_000_000
    limits: wire.Limits = field(default_factory=wire.Limits)
    model_names: tuple[str, ...] = ()
    metrics: str = "auth"
    """``GET /metrics`` (Prometheus): ``auth`` behind the API key like ``/v1``, ``open``, or ``off``."""

    def __post_init__(self) -> None:
        check_api_key(self.api_key)
        from logtoku_guard.server.metrics import METRICS_MODES

        if self.metrics not in METRICS_MODES:
            msg = f"--metrics must be one of {', '.join(METRICS_MODES)}, got {self.metrics!r}"
            raise ConfigurationError(msg)


def check_api_key(key: str | None) -> str | None:
    """``key`` if clients can send it as ``Authorization: Bearer KEY`` (``None``: no key); raise otherwise.

    An empty key would let in any request with a bare ``Bearer`` header; a key with spaces or
    characters outside printable ASCII could never be matched from an HTTP header.
    """
    if key is None:
        return None
    if not key.strip():
        msg = (
            f"--api-key is empty ({key!r}): any request would pass with a bare 'Authorization: Bearer' header; "
            "pass a real key (e.g. from: python -c 'import secrets; print(secrets.token_urlsafe(32))'), "
            "or leave --api-key out to serve without one"
        )
        raise ConfigurationError(msg)
    if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
        msg = (
            "--api-key must be printable ASCII without spaces (clients send it in the header 'Authorization: Bearer KEY'); "
            "pass a key such as one from: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
        raise ConfigurationError(msg)
    return key


def require_serve_extra() -> None:
    """Raise :class:`MissingDependencyError` unless FastAPI and uvicorn are installed."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        msg = f"the server needs the 'serve' extra ({exc.name} is missing): pip install 'logtoku-guard[serve]'"
        raise MissingDependencyError(msg) from exc


def create_app(engine: Engine, settings: ServerSettings | None = None) -> Any:
    """The FastAPI app serving ``engine``'s backend under the OpenAI/vLLM API."""
    require_serve_extra()
    import anyio
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException

    class ClosingStreamingResponse(StreamingResponse):
        """Closes its event generator in the task that streamed it, also when the client hangs up.

        Starlette leaves the body iterator open when the client disconnects mid-stream; left to
        the garbage collector, the generation would hold its runner slot until a finalizer task runs.
        """

        def __init__(self, events: AsyncGenerator[bytes, None], **kwargs: Any) -> None:
            super().__init__(events, **kwargs)
            self._events = events

        async def stream_response(self, send: Any) -> None:
            try:
                await super().stream_response(send)
            finally:
                with anyio.CancelScope(shield=True):  # cancelled by the disconnect: still close it
                    await self._events.aclose()

    settings = settings or ServerSettings()
    backend = engine.backend
    limits = wire.Limits(
        settings.limits.max_tokens,
        settings.limits.default_max_tokens,
        int(backend.k),
        max_top_logprobs=wire.kept_alternatives(backend),
        logprobs_mode=settings.limits.logprobs_mode,
        default_temperature=settings.limits.default_temperature,
    )
    mode = limits.logprobs_mode
    names: Sequence[str] = settings.model_names or (backend.model_name,)
    text_of = _token_text(backend)
    metrics = None
    if settings.metrics != "off":
        require_metrics_extra()
        from logtoku_guard.server.metrics import ServerMetrics

        metrics = ServerMetrics(engine.runner, backend)
    app = FastAPI(
        title="logtoku-guard",
        summary="OpenAI-compatible API (log-probabilities, or vLLM's raw logits), plus LogTokU scores and guard decisions.",
        version=__version__,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )

    def error(exc: wire.RequestError, extra: Any = None) -> JSONResponse:
        return JSONResponse(exc.body(extra), status_code=exc.status)

    nul_refused = nul_refusal(engine.store)
    # inside the key check: added first
    app.add_middleware(BodyLimits, max_bytes=settings.max_body_bytes, nul_refused=nul_refused)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Any:
        guarded_path = request.url.path.startswith("/v1") or (request.url.path == "/metrics" and settings.metrics == "auth")
        if settings.api_key is not None and guarded_path:
            header = request.headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), settings.api_key.encode()):
                msg = "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the server's --api-key"
                return error(wire.RequestError(401, msg))
        return await call_next(request)

    async def handle(req: wire.AnyRequest, request: Request) -> Any:
        started = time.perf_counter()
        endpoint = "chat" if isinstance(req, proto.ChatCompletionRequest) else "completions"
        try:
            wire.check_model(req.model, names)
            options = wire.decoding_options(req, limits)
            wire.check_backend_params(req, options, backend)
            plan = tools.NO_TOOLS
            if isinstance(req, proto.ChatCompletionRequest):
                plan = tools.plan(req, backend)
                messages = tools.chat_turns(req, plan)
                options = options.replace(constraint=plan.constraint)
            else:
                messages = wire.chat_messages(req)
            if req.stream:
                return ClosingStreamingResponse(
                    sse.events(engine, req, messages, options, names[0], text_of, plan, mode, Tally(metrics, endpoint, started)),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                )
            if isinstance(req, proto.ChatCompletionRequest):
                gated = await while_connected(request, lambda cancel: gate.answer_gated(engine, plan, messages, options, cancel))
                answer = gated.answer
            else:
                answer = await while_connected(request, lambda cancel: engine.answer(messages, options, cancel))
        except ClientGone:
            Tally(metrics, endpoint, started).refused(499)
            return Response(status_code=499)  # nobody reads it: the client went away
        except wire.RequestError as exc:
            Tally(metrics, endpoint, started).refused(exc.status)
            return error(exc)
        except LogTokUError as exc:
            response = _library_error(exc, error)
            Tally(metrics, endpoint, started).refused(response.status_code, getattr(exc, "result", None))
            return response
        Tally(metrics, endpoint, started).answered(answer)
        if isinstance(req, proto.ChatCompletionRequest):
            out, held = gated.reply, gated.withheld_calls
            body: Any = wire.chat_response(
                req,
                answer.generation,
                out.content,
                names[0],
                text_of,
                answer.guard_result,
                tool_calls=out.tool_calls,
                tool_scores=out.scores if out.tool_calls else None,
                mode=mode,
                answer_tokens=wire.answer_tokens(backend, answer.guard_result, answer.text, out.content if held else None),
                held=held,
                decision_extra=gate.gated_extra(gated),
            )
        else:
            sent = wire.answer_tokens(backend, answer.guard_result, answer.text)
            body = wire.completion_response(
                req, answer.generation, answer.text, names[0], text_of, answer.guard_result, mode=mode, answer_tokens=sent
            )
        return Response(sse.json_body(body), media_type="application/json", headers=refusal.decision_headers(answer.guard_result))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    if metrics is not None:

        @app.get("/metrics", include_in_schema=False)
        async def prometheus() -> Any:
            body, content_type = metrics.exposition()
            return Response(body, media_type=content_type)

    @app.get("/v1/models", response_model=proto.ModelList, responses=_ERRORS)
    async def models() -> Any:
        """The served model (one name)."""
        return Response(sse.json_body(wire.models_response(names)), media_type="application/json")

    @app.post("/v1/chat/completions", response_model=proto.ChatCompletionResponse, responses=_ERRORS)
    async def chat_completions(body: proto.ChatCompletionRequest, request: Request) -> Any:
        """A chat answer with log-probabilities and LogTokU scores per token; ``stream: true`` answers as
        server-sent events of :class:`ChatCompletionChunk` ending with ``data: [DONE]``."""
        return await handle(body, request)

    @app.post("/v1/completions", response_model=proto.CompletionResponse, responses=_ERRORS)
    async def completions(body: proto.CompletionRequest, request: Request) -> Any:
        """A completion of one prompt (the legacy API); ``stream: true`` answers as server-sent events."""
        return await handle(body, request)

    @app.get("/v1/logtoku/reviews/{review_id}", response_model=proto.ReviewVerdict, responses=_ERRORS)
    async def review(review_id: str, request: Request, wait: float = 0.0) -> Any:
        """A served answer sent to human review (its id is ``logtoku_guard.review_id``): the verdict and the
        released answer; ``wait`` (seconds, at most 60) holds the request until a reviewer decides."""
        try:
            item = await while_connected(request, lambda _: reviews.review_item(engine, review_id, wait))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client went away
        except wire.RequestError as exc:
            return error(exc)
        return Response(sse.json_body(reviews.verdict(item)), media_type="application/json")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = proto.describe_errors(exc.errors())
        endpoint = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(request.url.path)
        if endpoint is not None:
            Tally(metrics, endpoint, time.perf_counter()).refused(400)
        return error(wire.RequestError(400, message, param=param))

    @app.exception_handler(HTTPException)
    async def refused(request: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's JSON parser gave up below BodyLimits' depth limit
            return error(wire.RequestError(400, TOO_DEEP))
        return error(wire.RequestError(exc.status_code, str(exc.detail)))

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        msg = (
            f"no route {request.method} {request.url.path}; this server has "
            "GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /v1/logtoku/reviews/{id}"
        )
        return error(wire.RequestError(404, msg))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette raises the exception again once this answer is sent: the server logs it with its traceback.
        msg = f"internal error while handling {request.method} {request.url.path}: {exc.__class__.__name__}"
        return error(wire.RequestError(500, msg))

    @app.exception_handler(405)
    async def bad_method(request: Request, exc: Exception) -> JSONResponse:
        return error(wire.RequestError(405, f"{request.method} is not allowed on {request.url.path}", kind="method_not_allowed"))

    return app


def _library_error(exc: LogTokUError, error: Any) -> Any:
    from logtoku_guard.decision.results import GuardRejectedError
    from logtoku_guard.wire.payloads import served_decision_payload

    if isinstance(exc, GuardRejectedError):  # the draft is withheld: the decision only, without it
        extra = {"logtoku_guard": dict(served_decision_payload(exc.result))}
        return error(wire.RequestError(422, str(exc), kind="guard_rejected"), extra)
    if isinstance(exc, ConfigurationError):  # bad prompt, prompt too long, bad options
        return error(wire.RequestError(400, str(exc)))
    if isinstance(exc, AuditStoreError):  # the database's address goes to the log only
        logger.error("the audit store failed: %s", exc)
        return error(wire.RequestError(503, "the audit store is unreachable; try again later"))
    logger.error("generation failed: %s", exc, exc_info=exc)
    return error(wire.RequestError(500, f"generation failed: {exc.__class__.__name__}: {exc}"))


def _token_text(backend: Backend) -> wire.TokenText:
    """``decode([id])`` with the backend's tokenizer, or vLLM's ``token_id:<id>`` without one."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return lambda i: f"token_id:{i}"

    @lru_cache(maxsize=65536)
    def text_of(i: int) -> str:
        return str(tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False))

    return text_of


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": proto.ErrorResponse, "description": text}
    for status, text in (
        (400, "Invalid request (OpenAI error body)"),
        (401, "Missing or wrong API key"),
        (404, "Unknown model"),
        (413, "Request body over the server's limit"),
        (422, "Refused by the guard's policy (raise action); the decision is in error.logtoku_guard"),
    )
}
