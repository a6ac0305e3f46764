"""The ASGI app (FastAPI): ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``.

A body is first held to the size and nesting limits (:class:`~logtoku_guard.server.body.BodyLimits`),
then FastAPI parses it into the request models of :mod:`logtoku_guard.openai_protocol` (their
schemas are served at ``GET /openapi.json``, browsable at ``GET /docs``); the server's own
limits are checked by :mod:`logtoku_guard.server.wire` and generation runs through
:class:`~logtoku_guard.server.engine.Engine`. Every refusal is an OpenAI error body with a 4xx
status; an API key, when set, is required as ``Authorization: Bearer KEY`` on every ``/v1``
route (``GET /health``, ``/docs`` and ``/openapi.json`` stay open).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at runtime.

import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

from logtoku_guard import __version__
from logtoku_guard import openai_protocol as proto
from logtoku_guard.errors import ConfigurationError, LogTokUError, MissingDependencyError, short_repr
from logtoku_guard.server import gate, tools, wire
from logtoku_guard.server.body import TOO_DEEP, BodyLimits
from logtoku_guard.server.engine import Answer, ClientGone, Engine
from logtoku_guard.types import ChatMessage, DecodingOptions, TokenScore

logger = logging.getLogger(__name__)
T = TypeVar("T")


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


DISCONNECT_POLL_S = 0.1
"""Pause between two reads of a request's connection that brought something other than its disconnect."""


async def _while_connected(request: Any, work: Callable[[threading.Event], Awaitable[T]]) -> T:
    """``await work(cancel)`` while watching the client: when it goes away, ``cancel`` is set (the
    generation stops at its next step) and :class:`ClientGone` is raised. Exceptions of ``work`` pass as they are."""
    import anyio

    cancel = threading.Event()
    outcome: list[Any] = []

    async def run(scope: Any) -> None:
        try:
            outcome.append(("ok", await work(cancel)))
        except Exception as exc:
            outcome.append(("error", exc))
        scope.cancel()

    async def watch(scope: Any) -> None:
        # The body has been read: the connection's next message is the client's disconnect.
        while (await request.receive()).get("type") != "http.disconnect":
            await anyio.sleep(DISCONNECT_POLL_S)
        cancel.set()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        await run(tg.cancel_scope)
    if not outcome:
        raise ClientGone
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def require_metrics_extra() -> None:
    """Raise :class:`MissingDependencyError` unless prometheus-client is installed (``/metrics``)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        msg = "GET /metrics needs prometheus-client (the 'serve' extra): pip install 'logtoku-guard[serve]', or --metrics off"
        raise MissingDependencyError(msg) from exc


@dataclass(frozen=True)
class _Tally:
    """Where one request's outcome is counted (nothing without metrics)."""

    metrics: Any
    endpoint: str
    started: float

    def answered(self, answer: Answer) -> None:
        if self.metrics is not None:
            self.metrics.answered(self.endpoint, answer.generation, answer.guard_result, time.perf_counter() - self.started)

    def refused(self, status: int, guard_result: Any = None) -> None:
        if self.metrics is not None:
            self.metrics.refused(self.endpoint, status, time.perf_counter() - self.started, guard_result)


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

    app.add_middleware(BodyLimits, max_bytes=settings.max_body_bytes)  # inside the key check: added first

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
            plan = tools.NO_TOOLS
            if isinstance(req, proto.ChatCompletionRequest):
                plan = tools.plan(req, backend)
                messages = tools.chat_turns(req, plan)
                options = options.replace(constraint=plan.constraint)
            else:
                messages = wire.chat_messages(req)
            if req.stream:
                return ClosingStreamingResponse(
                    _sse(engine, req, messages, options, names[0], text_of, plan, mode, _Tally(metrics, endpoint, started)),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                )
            if isinstance(req, proto.ChatCompletionRequest):
                gated = await _while_connected(request, lambda cancel: gate.answer_gated(engine, plan, messages, options, cancel))
                answer = gated.answer
            else:
                answer = await _while_connected(request, lambda cancel: engine.answer(messages, options, cancel))
        except ClientGone:
            _Tally(metrics, endpoint, started).refused(499)
            return Response(status_code=499)  # nobody reads it: the client went away
        except wire.RequestError as exc:
            _Tally(metrics, endpoint, started).refused(exc.status)
            return error(exc)
        except LogTokUError as exc:
            response = _library_error(exc, error)
            _Tally(metrics, endpoint, started).refused(response.status_code, getattr(exc, "result", None))
            return response
        _Tally(metrics, endpoint, started).answered(answer)
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
                answer_tokens=_answer_tokens(backend, answer, out.content if held else None),
                held=held,
                decision_extra=gate.gated_extra(gated),
            )
        else:
            sent = _answer_tokens(backend, answer)
            body = wire.completion_response(
                req, answer.generation, answer.text, names[0], text_of, answer.guard_result, mode=mode, answer_tokens=sent
            )
        return Response(_json(body), media_type="application/json")

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
        return Response(_json(wire.models_response(names)), media_type="application/json")

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
    async def review(review_id: str, wait: float = 0.0) -> Any:
        """A served answer sent to human review (its id is ``logtoku_guard.review_id``): the verdict and the
        released answer; ``wait`` (seconds, at most 60) holds the request until a reviewer decides."""
        try:
            item = await _review_item(engine, review_id, wait)
        except wire.RequestError as exc:
            return error(exc)
        return Response(_json(_verdict(item)), media_type="application/json")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = proto.describe_errors(exc.errors())
        endpoint = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(request.url.path)
        if endpoint is not None:
            _Tally(metrics, endpoint, time.perf_counter()).refused(400)
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


MAX_REVIEW_WAIT_S = 60.0
"""Longest ``wait`` of ``GET /v1/logtoku/reviews/{id}`` (a long poll; ask again after it)."""
_MAX_ID_DIGITS = 18  # below 2**63: an id of more digits names no item (and is never parsed as one)


async def _review_item(engine: Engine, review_id: str, wait: float) -> Any:
    """The review item ``review_id`` of ``engine``'s store, after up to ``wait`` seconds for a verdict."""
    import math

    import anyio.to_thread

    from logtoku_guard.errors import AuditStoreError, ReviewTimeoutError, UnknownReviewItemError

    store = engine.store
    if store is None or not hasattr(store, "review_item"):
        msg = "this server keeps no review queue: start it with --store (a SQLite file or a PostgreSQL URL) and a policy"
        raise wire.RequestError(404, msg)
    if not (math.isfinite(wait) and 0 <= wait <= MAX_REVIEW_WAIT_S):
        msg = f"wait={wait!r} must be a number of seconds from 0 to {MAX_REVIEW_WAIT_S:g} (ask again for a longer wait)"
        raise wire.RequestError(400, msg, param="wait")
    if not (review_id.isascii() and review_id.isdigit() and len(review_id) <= _MAX_ID_DIGITS):
        raise wire.RequestError(404, f"no review item {short_repr(review_id)}: ids are the review_id of a served answer")
    item_id = int(review_id)
    try:
        item = await anyio.to_thread.run_sync(store.review_item, item_id)
        if wait > 0 and not item.decided:
            try:
                item = await anyio.to_thread.run_sync(lambda: store.wait_for_decision(item_id, timeout=wait))
            except ReviewTimeoutError as exc:
                item = exc.item
    except UnknownReviewItemError:
        raise wire.RequestError(404, f"no review item {item_id} in this server's store") from None
    except AuditStoreError as exc:
        logger.error("review %s: the audit store failed: %s", item_id, exc)
        raise wire.RequestError(503, "the audit store is unreachable; try again later") from exc
    return item


def _verdict(item: Any) -> proto.ReviewVerdict:
    return proto.ReviewVerdict(
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


def _answer_tokens(backend: Any, answer: Answer, replaced: str | None = None) -> int | None:
    """``None`` when the client gets the draft; else the token count of the text it gets instead (the
    guard's message, or ``replaced``: the content left once the ``tool_calls`` rules held a call back),
    counted with the backend's tokenizer (0 for a backend without one), for ``usage``."""
    if not wire.withheld(answer.guard_result) and replaced is None:
        return None
    text = answer.text if wire.withheld(answer.guard_result) else replaced or ""
    count = getattr(backend, "count_tokens", None)
    return int(count(text)) if callable(count) and text else 0


def _library_error(exc: LogTokUError, error: Any) -> Any:
    from logtoku_guard.payloads import served_decision_payload
    from logtoku_guard.results import GuardRejectedError

    if isinstance(exc, GuardRejectedError):  # the draft is withheld: the decision only, without it
        extra = {"logtoku_guard": dict(served_decision_payload(exc.result))}
        return error(wire.RequestError(422, str(exc), kind="guard_rejected"), extra)
    if isinstance(exc, ConfigurationError):  # bad prompt, prompt too long, bad options
        return error(wire.RequestError(400, str(exc)))
    logger.error("generation failed: %s", exc, exc_info=exc)
    return error(wire.RequestError(500, f"generation failed: {exc.__class__.__name__}: {exc}"))


def _token_text(backend: Any) -> wire.TokenText:
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


def _json(body: Any) -> bytes:
    """A response model's JSON: the fields it was built with (an extra left unset is left out, as vLLM does)."""
    if isinstance(body, dict):
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return body.model_dump_json(exclude_unset=True).encode()


def _data(obj: Any) -> bytes:
    return b"data: " + _json(obj) + b"\n\n"


async def _sse(
    engine: Engine,
    req: wire.AnyRequest,
    messages: list[ChatMessage],
    options: DecodingOptions,
    model: str,
    text_of: wire.TokenText,
    plan: tools.ToolPlan = tools.NO_TOOLS,
    mode: wire.LogprobsMode = "raw_logprobs",
    tally: _Tally | None = None,
) -> AsyncGenerator[bytes, None]:
    """Server-sent events: one chunk per token, a final chunk with the extras, ``data: [DONE]``.

    With tools, the prose before a call streams token by token (:class:`~.tools.ProseStream`);
    the call is sent whole in one ``tool_calls`` delta once the answer ends, and the last chunk
    has ``finish_reason: "tool_calls"`` and the call's scores in ``logtoku.tool_calls``.

    Under a policy nothing is sent before the guard has decided (a withheld draft must never
    reach the client): the answer is made whole (:meth:`Engine.answer`), then sent.
    """
    chat = isinstance(req, proto.ChatCompletionRequest)
    prose = tools.ProseStream() if plan.names else None
    cid, created = wire.new_id("chatcmpl" if chat else "cmpl"), wire.now()
    if chat:
        yield _data(wire.chat_chunk(cid, created, model, proto.DeltaMessage(role="assistant", content="")))
    offset = 0
    answer: Answer | None = None
    guarded = engine.policy is not None
    gated: gate.GatedAnswer | None = None
    try:
        if guarded and chat:
            gated = await gate.answer_gated(engine, plan, messages, options)
            answer = gated.answer
        elif guarded:
            answer = await engine.answer(messages, options)
        else:
            async with aclosing(engine.stream(messages, options)) as items:
                async for item in items:
                    if isinstance(item, Answer):
                        answer = item
                        break
                    chunk = _token_chunk(req, cid, created, model, item, offset, text_of, prose, mode)
                    if chunk:
                        yield chunk
                    offset += len(item.text)
    except ClientGone:  # the client went away while a guard asked for another answer: nothing to send
        if tally is not None:
            tally.refused(499)
        return
    except LogTokUError as exc:
        from logtoku_guard.payloads import served_decision_payload
        from logtoku_guard.results import GuardRejectedError

        extra = {"logtoku_guard": served_decision_payload(exc.result)} if isinstance(exc, GuardRejectedError) else None
        status = 422 if extra else 400 if isinstance(exc, ConfigurationError) else 500
        if status == 500:
            logger.error("generation failed: %s", exc, exc_info=exc)
        if tally is not None:
            tally.refused(status, exc.result if isinstance(exc, GuardRejectedError) else None)
        yield _data(wire.error_body(str(exc), status, extra=extra))
        yield b"data: [DONE]\n\n"
        return
    except Exception as exc:  # the status line is sent: the client learns of the failure in the stream
        logger.error("generation failed: %s", exc, exc_info=exc)
        if tally is not None:
            tally.refused(500)
        yield _data(wire.error_body(f"generation failed: {exc.__class__.__name__}: {exc}", 500))
        yield b"data: [DONE]\n\n"
        return
    if answer is None:  # the generation ended without a result: cannot happen unless cancelled
        return
    g = answer.generation
    if tally is not None:
        tally.answered(answer)
    held = gated is not None and gated.withheld_calls
    if gated is not None:
        out = gated.reply
    else:
        out = tools.reply(plan, answer.text, g) if not wire.withheld(answer.guard_result) else tools.Reply(answer.text)
    sent = _answer_tokens(engine.backend, answer, out.content if held else None)
    replaced = guarded and (answer.text != g.text or held)
    if guarded and not replaced:  # the guard passed the draft: its tokens, as an unguarded stream sends them
        for t in g.tokens:
            chunk = _token_chunk(req, cid, created, model, t, offset, text_of, prose, mode)
            if chunk:
                yield chunk
            offset += len(t.text)
    if replaced:  # the guard replaced the answer (warn/abstain/review, a call held back): one chunk with its text
        text = out.content if chat else answer.text
        if text or not chat:
            yield _data(
                wire.chat_chunk(cid, created, model, proto.DeltaMessage(content=text))
                if chat
                else wire.completion_chunk(cid, created, model, answer.text)
            )
    elif prose is not None and not out.tool_calls and len(prose.text) > prose.sent:  # no call after all: the held text
        yield _data(wire.chat_chunk(cid, created, model, proto.DeltaMessage(content=prose.text[prose.sent :])))
    if out.tool_calls:
        yield _data(wire.chat_chunk(cid, created, model, proto.DeltaMessage(tool_calls=tools.call_deltas(out.tool_calls))))
    scores = out.scores if out.tool_calls else None
    final: proto.ChatCompletionChunk | proto.CompletionChunk = (
        wire.chat_chunk(
            cid,
            created,
            model,
            proto.DeltaMessage(),
            finish=g,
            guard_result=answer.guard_result,
            tool_scores=scores,
            held=held,
            decision_extra=gate.gated_extra(gated) if gated is not None else None,
        )
        if chat
        else wire.completion_chunk(cid, created, model, "", finish=g, guard_result=answer.guard_result)
    )
    yield _data(final)
    if req.include_usage:
        yield _data(final.model_copy(update={"choices": [], "usage": wire.usage(g, answer.guard_result, sent)}))
    yield b"data: [DONE]\n\n"


def _token_chunk(
    req: wire.AnyRequest,
    cid: str,
    created: int,
    model: str,
    t: TokenScore,
    offset: int,
    text_of: wire.TokenText,
    prose: tools.ProseStream | None = None,
    mode: wire.LogprobsMode = "raw_logprobs",
) -> bytes:
    """One token's chunk; with ``prose`` (tools), only the prose it releases, and ``b""`` when it
    releases none and no logprobs were asked for."""
    if isinstance(req, proto.ChatCompletionRequest):
        lp = proto.ChatLogprobs(content=[wire.chat_logprob(t, req.top_logprobs or 0, text_of, mode)]) if req.logprobs else None
        piece = t.text if prose is None else prose.feed(t.text)
        if prose is not None and not piece and lp is None:
            return b""
        delta = proto.DeltaMessage(content=piece) if piece or prose is None else proto.DeltaMessage()
        return _data(wire.chat_chunk(cid, created, model, delta, logprobs=lp))
    clp = None if req.logprobs is None else wire.completion_logprobs([t], req.logprobs, text_of, offset, mode)
    return _data(wire.completion_chunk(cid, created, model, t.text, logprobs=clp))
