"""The OpenAI / vLLM wire format: request parsing and response bodies, framework-free.

Requests are validated into :class:`ChatRequest` / :class:`CompletionRequest` (typed, frozen);
every problem raises :class:`RequestError` carrying the HTTP status and an OpenAI error body
(``{"error": {"message", "type", "param", "code"}}``).

Responses follow vLLM's OpenAI-compatible JSON exactly, with the values of vLLM's
``--logprobs-mode raw_logits``: every ``logprob`` field holds a **raw logit** (before softmax
or any sampling processor), not a log-probability.

* chat: ``choices[].logprobs.content[] = {token, logprob, bytes, top_logprobs: [{token,
  logprob, bytes}]}``;
* completions: ``choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token: value}],
  text_offset}``.

Extensions (extra keys an OpenAI client ignores): each chat ``content[]`` entry carries
``logtoku`` (the token's :class:`~logtoku_guard.payloads.TokenPayload`: au, eu, the true
full-softmax ``logprob`` and ``entropy``, ``id``, plus ``top_ids``); completions carry the same
list as ``logprobs.logtoku``; every choice carries ``logtoku`` (the response summary) and, with
a policy, ``logtoku_guard`` (the guard's decision, :func:`~logtoku_guard.payloads.result_payload`).

Token strings: a chosen token is written as the exact text piece it added to the answer (so the
pieces concatenate to ``content``; a piece is ``""`` while a UTF-8 character is incomplete);
an alternative in ``top_logprobs`` as ``decode([id])``, or ``"token_id:<id>"`` (vLLM's form)
when the backend has no tokenizer. The chosen token's ``logprob`` is its raw logit when it is
among the K kept logits (always under greedy decoding) and ``null`` when a sampled token falls
outside them: the backend keeps only the top-K raw logits (the ``logtoku`` extra still has its
true log-probability).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logtoku_guard.errors import short_repr
from logtoku_guard.payloads import json_float, result_payload, summary_payload, token_payload
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, TokenScore

TokenText = Callable[[int], str]
"""Decodes one token id into its text (for the alternatives in ``top_logprobs``)."""


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` and an OpenAI error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or _ERROR_TYPES.get(status, "invalid_request_error")

    def body(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return error_body(self.message, self.status, param=self.param, kind=self.kind, extra=extra)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "guard_rejected",
    500: "internal_error",
    503: "service_unavailable",
}


def error_body(
    message: str, status: int, *, param: str | None = None, kind: str | None = None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    err: dict[str, Any] = {
        "message": message,
        "type": kind or _ERROR_TYPES.get(status, "invalid_request_error"),
        "param": param,
        "code": status,
    }
    if extra:
        err.update(extra)
    return {"error": err}


# -- requests ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What the server accepts: the default and largest ``max_tokens``, the top-K it keeps."""

    max_tokens: int = 1024
    default_max_tokens: int = 256
    k: int = 2


@dataclass(frozen=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body."""

    messages: tuple[ChatMessage, ...]
    options: DecodingOptions
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int


@dataclass(frozen=True)
class CompletionRequest:
    """A validated ``POST /v1/completions`` body (``logprobs``: number of alternatives, or None)."""

    prompt: str
    options: DecodingOptions
    stream: bool
    include_usage: bool
    logprobs: int | None


def _bad(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, param=param)


SEED_LIMIT = 2**64
"""Seeds are 0 to ``SEED_LIMIT - 1`` (64 bits, what the random number generator takes)."""


def _int(body: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer, got {short_repr(value)}", name)
    return value


def _number(body: Mapping[str, Any], name: str, default: float) -> float:
    """A finite JSON number as a float (an integer of hundreds of digits overflows a float: refused)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"{name} must be a number, got {short_repr(value)}", name)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _bad(f"{name} must be a finite number, got {short_repr(value)}", name)
    return number


def check_model(body: Mapping[str, Any], served: Sequence[str]) -> None:
    """404 unless ``model`` (when given) names the served model."""
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str) or model not in served:
        raise RequestError(
            404,
            f"the model {short_repr(model)} does not exist on this server; it serves {served[0]!r} (see GET /v1/models)",
            param="model",
            kind="model_not_found",
        )


def _common(body: Mapping[str, Any], limits: Limits, *, max_tokens_default: int) -> tuple[DecodingOptions, bool, bool]:
    n = _int(body, "n", 1)
    if n != 1:
        raise _bad(f"n={short_repr(n)}: this server returns one choice per request; send n=1 (or several requests)", "n")
    if body.get("best_of") not in (None, 1):
        raise _bad(f"best_of={short_repr(body['best_of'])} is not supported; leave it out", "best_of")
    max_tokens = _int(body, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", max_tokens_default)
    if max_tokens is None or max_tokens < 1:
        raise _bad(f"max_tokens must be a positive integer, got {short_repr(max_tokens)}", "max_tokens")
    if max_tokens > limits.max_tokens:
        raise _bad(
            f"max_tokens={short_repr(max_tokens)} is above this server's limit of {limits.max_tokens}; ask for at most "
            f"{limits.max_tokens} (the server's --max-tokens)",
            "max_tokens",
        )
    temperature = _number(body, "temperature", 1.0)
    top_p = _number(body, "top_p", 1.0)
    seed = _int(body, "seed", None)
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise _bad(f"seed must be an integer from 0 to 2**64 - 1, got {short_repr(seed)}", "seed")
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise _bad(f"stop must be a string or a list of strings, got {short_repr(stop)}", "stop")
    if not all(stop):
        raise _bad(f"stop strings must not be empty, got {short_repr(list(stop))}", "stop")
    try:
        options = DecodingOptions(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop)
    except ValueError as exc:
        raise _bad(str(exc)) from exc
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(f"stream must be true or false, got {short_repr(stream)}", "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, Mapping):
        raise _bad(f"stream_options must be an object, got {short_repr(stream_options)}", "stream_options")
    return options, stream, bool(stream_options.get("include_usage", False))


def _content(value: Any, i: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: only text parts are supported
        parts = []
        for part in value:
            if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string, got {short_repr(value)}", "messages")


def parse_chat(body: Any, limits: Limits) -> ChatRequest:
    """Validate a chat request body (raises :class:`RequestError`)."""
    if not isinstance(body, Mapping):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {'role': ..., 'content': ...} objects", "messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant"):
            raise _bad(f"messages[{i}] must have role 'system', 'user' or 'assistant', got {short_repr(m)}", "messages")
        turns.append(ChatMessage(m["role"], _content(m.get("content"), i)))
    if not any(t.content.strip() for t in turns if t.role != "system"):
        raise _bad("every user/assistant message is empty; add the question as a user message", "messages")
    options, stream, include_usage = _common(body, limits, max_tokens_default=limits.default_max_tokens)
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise _bad(f"logprobs must be true or false in a chat request, got {short_repr(logprobs)}", "logprobs")
    top = _int(body, "top_logprobs", None)
    if top is not None and not logprobs:
        raise _bad("top_logprobs needs logprobs=true", "top_logprobs")
    top = _check_top(top or 0, limits, "top_logprobs")
    return ChatRequest(tuple(turns), options, stream, include_usage, logprobs, top)


def parse_completion(body: Any, limits: Limits) -> CompletionRequest:
    """Validate a completions request body (raises :class:`RequestError`)."""
    if not isinstance(body, Mapping):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad(f"prompt must be one string (one prompt per request), got {short_repr(prompt)}", "prompt")
    if not prompt.strip():
        raise _bad("prompt is empty; send the text to complete", "prompt")
    if body.get("echo"):
        raise _bad("echo=true is not supported; leave it out", "echo")
    if body.get("suffix") is not None:
        raise _bad("suffix is not supported; leave it out", "suffix")
    options, stream, include_usage = _common(body, limits, max_tokens_default=16)
    logprobs = _int(body, "logprobs", None)
    if logprobs is not None:
        logprobs = _check_top(logprobs, limits, "logprobs")
    return CompletionRequest(prompt, options, stream, include_usage, logprobs)


def _check_top(n: int, limits: Limits, param: str) -> int:
    if n < 0:
        raise _bad(f"{param} must be >= 0, got {short_repr(n)}", param)
    if n > limits.k:
        shown = short_repr(n)
        raise _bad(
            f"{param}={shown} but this server keeps the top K={limits.k} raw logits per token; ask for {param} <= {limits.k}, "
            f"or restart the server with --top-k {shown} (K also sets the K of its AU/EU; the LogTokU setting is 2)",
            param,
        )
    return n


# -- responses ---------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def chosen_logit(t: TokenScore) -> float | None:
    """The chosen token's raw logit when it is among the kept top-K (else ``None``)."""
    for z, i in zip(t.top_logits, t.top_ids):
        if i == t.id:
            return json_float(z)
    return None


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def logtoku_extra(t: TokenScore) -> dict[str, Any]:
    """The per-token ``logtoku`` extension: :func:`token_payload` plus ``top_ids``."""
    out: dict[str, Any] = dict(token_payload(t))
    out["top_ids"] = list(t.top_ids)
    return out


def chat_logprob(t: TokenScore, n_top: int, text_of: TokenText) -> dict[str, Any]:
    """One ``choices[].logprobs.content[]`` entry (values: raw logits)."""
    tops = []
    for z, i in list(zip(t.top_logits, t.top_ids))[:n_top]:
        s = t.text if i == t.id else text_of(i)
        tops.append({"token": s, "logprob": json_float(z), "bytes": _bytes(s)})
    return {
        "token": t.text,
        "logprob": chosen_logit(t),
        "bytes": _bytes(t.text),
        "top_logprobs": tops,
        "logtoku": logtoku_extra(t),
    }


def _finish(g: Generation) -> str:
    return "abort" if g.finish_reason == "cancelled" else g.finish_reason


def usage(g: Generation) -> dict[str, int]:
    n = len(g.tokens)
    return {"prompt_tokens": g.prompt_tokens, "completion_tokens": n, "total_tokens": g.prompt_tokens + n}


def choice_extras(g: Generation, guard_result: Any = None) -> dict[str, Any]:
    """The per-choice extensions: ``logtoku`` summary and, with a policy, ``logtoku_guard``."""
    out: dict[str, Any] = {"logtoku": dict(summary_payload(g))}
    if guard_result is not None:
        out["logtoku_guard"] = dict(result_payload(guard_result))
    return out


def chat_response(
    req: ChatRequest, g: Generation, answer: str, model: str, text_of: TokenText, guard_result: Any = None
) -> dict[str, Any]:
    """A whole ``chat.completion`` body."""
    logprobs = {"content": [chat_logprob(t, req.top_logprobs, text_of) for t in g.tokens]} if req.logprobs else None
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer, "tool_calls": []},
                "logprobs": logprobs,
                "finish_reason": _finish(g),
                "stop_reason": g.stop_sequence,
                **choice_extras(g, guard_result),
            }
        ],
        "usage": usage(g),
    }


def chat_chunk(
    cid: str, created: int, model: str, delta: dict[str, Any], *, logprobs: Any = None, finish: Generation | None = None
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (the last one, ``finish`` given, has the finish reason and extras)."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}
    if finish is not None:
        choice["finish_reason"] = _finish(finish)
        choice["stop_reason"] = finish.stop_sequence
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def completion_logprobs(tokens: Sequence[TokenScore], n_top: int, text_of: TokenText, offset: int = 0) -> dict[str, Any]:
    """The legacy ``logprobs`` object of a completion choice (values: raw logits)."""
    out: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": [], "logtoku": []}
    for t in tokens:
        out["text_offset"].append(offset)
        offset += len(t.text)
        out["tokens"].append(t.text)
        out["token_logprobs"].append(chosen_logit(t))
        out["top_logprobs"].append(
            {(t.text if i == t.id else text_of(i)): json_float(z) for z, i in list(zip(t.top_logits, t.top_ids))[:n_top]}
        )
        out["logtoku"].append(logtoku_extra(t))
    return out


def completion_response(
    req: CompletionRequest, g: Generation, answer: str, model: str, text_of: TokenText, guard_result: Any = None
) -> dict[str, Any]:
    """A whole ``text_completion`` body."""
    logprobs = None if req.logprobs is None else completion_logprobs(g.tokens, req.logprobs, text_of)
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": answer,
                "logprobs": logprobs,
                "finish_reason": _finish(g),
                "stop_reason": g.stop_sequence,
                **choice_extras(g, guard_result),
            }
        ],
        "usage": usage(g),
    }


def completion_chunk(
    cid: str, created: int, model: str, text: str, *, logprobs: Any = None, finish: Generation | None = None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": None}
    if finish is not None:
        choice["finish_reason"] = _finish(finish)
        choice["stop_reason"] = finish.stop_sequence
    return {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def models_response(names: Sequence[str], owner: str = "logtoku-guard") -> dict[str, Any]:
    created = now()
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": owner} for n in names]}
