"""The request body's limits, checked before anything parses it: size and JSON nesting depth (an ASGI middleware).

A body over ``max_bytes`` is refused with 413 as soon as its ``Content-Length`` (or, without one,
the bytes received so far) says so, without reading the rest. A body that nests JSON arrays or
objects deeper than ``max_depth`` is refused with 400 before the JSON parser (which recurses per
level and would fail with a ``RecursionError``) sees it. A body that is not UTF-8, or holds a
number of more digits than Python's JSON parser reads, is refused with a 400 saying so (not
FastAPI's bare "There was an error parsing the body"); with a store that cannot keep the
character U+0000 (PostgreSQL), a body holding it is refused with a 400 before anything is
generated (:func:`nul_refusal`). The body read here is handed on whole to the app; later
``receive`` calls go to the client's connection (so a stream still learns of a client that hangs up).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from logtoku_guard.server.wire import RequestError
from logtoku_guard.wire.openai_tools import json_depth as json_depth  # re-exported: the body's depth check

if TYPE_CHECKING:
    from logtoku_guard.audit.records import RecordSink

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

_LONG_DIGITS = re.compile(rb"\d{%d,}" % (sys.get_int_max_str_digits() or 4300))
"""A run of digits as long as Python's JSON parser refuses in a number (a string may hold one too)."""
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
"""``\\u0000`` escaped in a JSON string (after an even number of backslashes: not a literal backslash and ``u0000``)."""

_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
"""An escaped UTF-16 surrogate (a pair is one character; one alone is not)."""


def _short(text: str, most: int = 40) -> str:
    """``text`` cut to about ``most`` characters for an error message (a key can be megabytes long)."""
    return text if len(text) <= most else f"{text[: most // 2]}...{text[-(most // 4) :]}"


def _lone_surrogate(value: Any, path: str) -> tuple[str, str] | None:
    """The path and character of the first lone surrogate in ``value``'s strings (keys included)."""
    if isinstance(value, str):
        found = next((c for c in value if 0xD800 <= ord(c) <= 0xDFFF), None)
        return None if found is None else (path, found)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = _lone_surrogate(key, f"{path} key") if isinstance(key, str) else None
        where = where or _lone_surrogate(item, f"{path}.{_short(key)}" if isinstance(key, str) else f"{path}[{key}]")
        if where is not None:
            return where
    return None


def nul_refusal(store: RecordSink | None) -> str | None:
    """What cannot keep U+0000 when ``store`` is a PostgreSQL audit store (its text fields refuse it), else None."""
    engine = getattr(store, "engine", None)
    dialect = getattr(getattr(engine, "dialect", None), "name", None)
    return "this server's audit store (PostgreSQL)" if dialect == "postgresql" else None


def check_text(body: bytes, nul_refused: str | None = None) -> None:
    """Raise a 400 :class:`RequestError` for a body that is not UTF-8, holds a number too long for the
    JSON parser, or (``nul_refused``: what cannot keep it) the character U+0000."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = body[exc.start : exc.start + 1].hex()
        msg = f"the request body is not valid UTF-8 (byte 0x{bad} at offset {exc.start}); send JSON encoded as UTF-8"
        raise RequestError(400, msg) from None
    if _LONG_DIGITS.search(body) is not None:
        try:
            json.loads(body)
        except ValueError as exc:
            if "digits" in str(exc):
                limit = sys.get_int_max_str_digits()
                msg = f"the request body holds a number of more than {limit} digits, which no field takes; send a smaller number"
                raise RequestError(400, msg) from None
    if _SURROGATE.search(body) is not None:
        try:
            where = _lone_surrogate(json.loads(body), "body")
        except (ValueError, RecursionError):
            where = None  # not JSON: FastAPI's parser reports it
        if where is not None:
            path, char = where
            msg = f"{_short(path, 400)} holds the lone surrogate {char!r}, which is not a character; send valid Unicode text"
            raise RequestError(400, msg)
    if nul_refused is not None and _NUL.search(body) is not None:
        msg = f"the request holds the character U+0000 (NUL, \\u0000), which {nul_refused} cannot keep; remove it from the text"
        raise RequestError(400, msg)


class BodyLimits:
    """ASGI middleware: refuse a POST/PUT/PATCH body over ``max_bytes`` (413), nested deeper than ``max_depth``
    (400), or whose text cannot be read (:func:`check_text`, 400)."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_depth: int = MAX_JSON_DEPTH, nul_refused: str | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.nul_refused = nul_refused

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
        try:
            check_text(body, self.nul_refused)
        except RequestError as exc:
            await _answer(send, exc)
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
