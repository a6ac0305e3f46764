"""The request body's limits, checked before anything parses it: size and JSON nesting depth (an ASGI middleware).

A body over ``max_bytes`` is refused with 413 as soon as its ``Content-Length`` (or, without one,
the bytes received so far) says so, without reading the rest. A body that nests JSON arrays or
objects deeper than ``max_depth`` is refused with 400 before the JSON parser (which recurses per
level and would fail with a ``RecursionError``) sees it. The body read here is handed on whole
to the app; later ``receive`` calls go to the client's connection (so a stream still learns of a
client that hangs up).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from logtoku_guard.server.wire import RequestError
from logtoku_guard.tools.openai_tools import json_depth as json_depth  # re-exported: the body's depth check

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_JSON_DEPTH = 950
"""Deepest nesting of arrays/objects a request body may have: just under where Python's JSON parser,
which recurses per level, runs into the interpreter's recursion limit (1000 frames) in a request
handler. An OpenAI request needs about 5 levels."""

TOO_DEEP = "the request body nests JSON arrays/objects too deeply to read; send a flat OpenAI request body"


class BodyLimits:
    """ASGI middleware: refuse a POST/PUT/PATCH body over ``max_bytes`` (413) or nested deeper than ``max_depth`` (400)."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except RequestError as exc:
            await _answer(send, exc)
            return
        if body is None:  # the client left: answered all the same, for the layers above (nobody reads it)
            await _answer(send, RequestError(400, "the client closed the connection before sending the whole body"))
            return
        if json_depth(body, self.max_depth) > self.max_depth:
            await _answer(send, RequestError(400, f"{TOO_DEEP} (at most {self.max_depth} levels)"))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        limit = self.max_bytes
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"request body of {declared} bytes is over the server's limit of {limit} bytes")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"request body is over the server's limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _answer(send: Send, exc: RequestError) -> None:
    payload = json.dumps(exc.body(), ensure_ascii=False).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
