"""The ASGI app (FastAPI): ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``.

Bodies are read with a size limit and parsed by :mod:`logtoku_guard.server.wire`; generation
runs through :class:`~logtoku_guard.server.engine.Engine`. Every refusal is an OpenAI error
body with a 4xx status; an API key, when set, is required as ``Authorization: Bearer KEY`` on
every ``/v1`` route (``GET /health`` stays open for probes).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at runtime.

import json
import logging
import secrets
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from logtoku_guard.errors import ConfigurationError, LogTokUError, MissingDependencyError
from logtoku_guard.server import wire
from logtoku_guard.server.engine import Answer, Engine
from logtoku_guard.types import ChatMessage, TokenScore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    """Request limits and access: ``api_key`` (None = open), ``max_body_bytes``, ``limits``."""

    api_key: str | None = None
    max_body_bytes: int = 1_000_000
    limits: wire.Limits = field(default_factory=wire.Limits)
    model_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_api_key(self.api_key)


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
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.requests import ClientDisconnect

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
    limits = wire.Limits(settings.limits.max_tokens, settings.limits.default_max_tokens, int(backend.k))
    names: Sequence[str] = settings.model_names or (backend.model_name,)
    text_of = _token_text(backend)
    app = FastAPI(title="logtoku-guard", docs_url=None, redoc_url=None, openapi_url=None)

    def error(exc: wire.RequestError, extra: Any = None) -> JSONResponse:
        return JSONResponse(exc.body(extra), status_code=exc.status)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Any:
        if settings.api_key is not None and request.url.path.startswith("/v1"):
            header = request.headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), settings.api_key.encode()):
                msg = "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the server's --api-key"
                return error(wire.RequestError(401, msg))
        return await call_next(request)

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        limit = settings.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise wire.RequestError(413, f"request body of {declared} bytes is over the server's limit of {limit} bytes")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise wire.RequestError(413, f"request body is over the server's limit of {limit} bytes")
                chunks.append(chunk)
        except ClientDisconnect as exc:  # nobody is left to answer; not a server error
            raise wire.RequestError(400, "the client closed the connection before sending the whole body") from exc
        try:
            return json.loads(b"".join(chunks))
        except RecursionError as exc:
            msg = "the request body nests JSON arrays/objects too deeply to read; send a flat OpenAI request body"
            raise wire.RequestError(400, msg) from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise wire.RequestError(400, f"the request body is not valid JSON ({exc})") from exc

    async def handle(request: Request, chat: bool) -> Any:
        try:
            body = await read_json(request)
            if isinstance(body, dict):
                wire.check_model(body, names)
            req = wire.parse_chat(body, limits) if chat else wire.parse_completion(body, limits)
            messages = list(req.messages) if isinstance(req, wire.ChatRequest) else [ChatMessage("user", req.prompt)]
            if req.stream:
                return ClosingStreamingResponse(
                    _sse(engine, req, messages, names[0], text_of),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                )
            answer = await engine.answer(messages, req.options)
        except wire.RequestError as exc:
            return error(exc)
        except LogTokUError as exc:
            return _library_error(exc, error)
        if isinstance(req, wire.ChatRequest):
            return wire.chat_response(req, answer.generation, answer.text, names[0], text_of, answer.guard_result)
        return wire.completion_response(req, answer.generation, answer.text, names[0], text_of, answer.guard_result)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return wire.models_response(names)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await handle(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await handle(request, chat=False)

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        msg = (
            f"no route {request.method} {request.url.path}; this server has "
            "GET /v1/models, POST /v1/chat/completions, POST /v1/completions"
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
    from logtoku_guard.guard import GuardRejectedError
    from logtoku_guard.payloads import result_payload

    if isinstance(exc, GuardRejectedError):
        extra = {"logtoku_guard": dict(result_payload(exc.result))}
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


def _data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def _sse(
    engine: Engine,
    req: wire.ChatRequest | wire.CompletionRequest,
    messages: list[ChatMessage],
    model: str,
    text_of: wire.TokenText,
) -> AsyncGenerator[bytes, None]:
    """Server-sent events: one chunk per token, a final chunk with the extras, ``data: [DONE]``."""
    chat = isinstance(req, wire.ChatRequest)
    cid, created = wire.new_id("chatcmpl" if chat else "cmpl"), wire.now()
    if chat:
        yield _data(wire.chat_chunk(cid, created, model, {"role": "assistant", "content": ""}))
    offset = 0
    answer: Answer | None = None
    guarded = engine.policy is not None
    tokens: list[TokenScore] = []
    try:
        async with aclosing(engine.stream(messages, req.options)) as items:
            async for item in items:
                if isinstance(item, Answer):
                    answer = item
                    break
                if guarded:
                    tokens.append(item)  # sent below, once the answer is known to be the draft
                    continue
                yield _token_chunk(req, cid, created, model, item, offset, text_of)
                offset += len(item.text)
    except LogTokUError as exc:
        from logtoku_guard.guard import GuardRejectedError
        from logtoku_guard.payloads import result_payload

        extra = {"logtoku_guard": dict(result_payload(exc.result))} if isinstance(exc, GuardRejectedError) else None
        status = 422 if extra else 400 if isinstance(exc, ConfigurationError) else 500
        if status == 500:
            logger.error("generation failed: %s", exc, exc_info=exc)
        yield _data(wire.error_body(str(exc), status, extra=extra))
        yield b"data: [DONE]\n\n"
        return
    except Exception as exc:  # the status line is sent: the client learns of the failure in the stream
        logger.error("generation failed: %s", exc, exc_info=exc)
        yield _data(wire.error_body(f"generation failed: {exc.__class__.__name__}: {exc}", 500))
        yield b"data: [DONE]\n\n"
        return
    if answer is None:  # the generation ended without a result: cannot happen unless cancelled
        return
    g = answer.generation
    if guarded:
        if answer.text == g.text:
            for t in tokens:
                yield _token_chunk(req, cid, created, model, t, offset, text_of)
                offset += len(t.text)
        else:  # the guard replaced the answer (warn/abstain/review): one chunk with it
            delta_text = answer.text
            yield _data(
                wire.chat_chunk(cid, created, model, {"content": delta_text})
                if chat
                else wire.completion_chunk(cid, created, model, delta_text)
            )
    final = (
        wire.chat_chunk(cid, created, model, {}, finish=g) if chat else wire.completion_chunk(cid, created, model, "", finish=g)
    )
    final["choices"][0].update(wire.choice_extras(g, answer.guard_result))
    yield _data(final)
    if req.include_usage:
        yield _data(
            {"id": cid, "object": final["object"], "created": created, "model": model, "choices": [], "usage": wire.usage(g)}
        )
    yield b"data: [DONE]\n\n"


def _token_chunk(
    req: wire.ChatRequest | wire.CompletionRequest,
    cid: str,
    created: int,
    model: str,
    t: TokenScore,
    offset: int,
    text_of: wire.TokenText,
) -> bytes:
    if isinstance(req, wire.ChatRequest):
        lp = {"content": [wire.chat_logprob(t, req.top_logprobs, text_of)]} if req.logprobs else None
        return _data(wire.chat_chunk(cid, created, model, {"content": t.text}, logprobs=lp))
    clp = None if req.logprobs is None else wire.completion_logprobs([t], req.logprobs, text_of, offset)
    return _data(wire.completion_chunk(cid, created, model, t.text, logprobs=clp))
