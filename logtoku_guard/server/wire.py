"""The server's side of the wire protocol: settings-dependent checks and the response bodies.

The bodies themselves are the pydantic models of :mod:`logtoku_guard.openai_protocol` (FastAPI
parses the requests into them); this module adds what depends on the server (the largest
``max_tokens``, the K of its top-K logits, the served model's name), turns a request into
:class:`~logtoku_guard.types.DecodingOptions` and chat messages, and builds the response models
from a :class:`~logtoku_guard.types.Generation`. Every refusal is a :class:`RequestError`
carrying the HTTP status and an OpenAI error body.

Token strings: a chosen token is written as the exact text piece it added to the answer (so the
pieces concatenate to ``content``; a piece is ``""`` while a UTF-8 character is incomplete);
an alternative in ``top_logprobs`` as ``decode([id])``, or ``"token_id:<id>"`` (vLLM's form)
when the backend has no tokenizer. The chosen token's ``logprob`` is its raw logit when it is
among the K kept logits (always under greedy decoding) and ``null`` when a sampled token falls
outside them: the backend keeps only the top-K raw logits (the ``logtoku`` extra still has its
true log-probability).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logtoku_guard import openai_protocol as proto
from logtoku_guard.errors import short_repr
from logtoku_guard.payloads import json_float, result_payload, summary_payload, token_payload
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, TokenScore

TokenText = Callable[[int], str]
"""Decodes one token id into its text (for the alternatives in ``top_logprobs``)."""

AnyRequest = proto.ChatCompletionRequest | proto.CompletionRequest


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
    """OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` (:class:`~.openai_protocol.ErrorResponse`)."""
    info = proto.ErrorInfo(
        message=message, type=kind or _ERROR_TYPES.get(status, "invalid_request_error"), param=param, code=status, **(extra or {})
    )
    return proto.ErrorResponse(error=info).model_dump(mode="json", exclude_unset=True)  # no logtoku_guard unless given


# -- requests: what depends on the server's settings ----------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What the server accepts: the default and largest ``max_tokens``, the top-K it keeps."""

    max_tokens: int = 1024
    default_max_tokens: int = 256
    k: int = 2


COMPLETION_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` of ``/v1/completions``."""


def check_model(model: str | None, served: Sequence[str]) -> None:
    """404 unless ``model`` (when given) names the served model."""
    if model is not None and model not in served:
        raise RequestError(
            404,
            f"the model {short_repr(model)} does not exist on this server; it serves {served[0]!r} (see GET /v1/models)",
            param="model",
            kind="model_not_found",
        )


def decoding_options(req: AnyRequest, limits: Limits) -> DecodingOptions:
    """The request's decoding options, within the server's ``max_tokens`` and top-K (raises :class:`RequestError`)."""
    chat = isinstance(req, proto.ChatCompletionRequest)
    max_tokens = req.requested_max_tokens
    if max_tokens is None:
        max_tokens = limits.default_max_tokens if chat else COMPLETION_DEFAULT_MAX_TOKENS
    if max_tokens > limits.max_tokens:
        raise RequestError(
            400,
            f"max_tokens={short_repr(max_tokens)} is above this server's limit of {limits.max_tokens}; ask for at most "
            f"{limits.max_tokens} (the server's --max-tokens)",
            param="max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens",
        )
    if isinstance(req, proto.ChatCompletionRequest):
        _check_top(req.top_logprobs or 0, limits, "top_logprobs")
    elif req.logprobs is not None:
        _check_top(req.logprobs, limits, "logprobs")
    return DecodingOptions(
        max_new_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed,
        stop=req.stop_strings,
    )


def _check_top(n: int, limits: Limits, param: str) -> None:
    if n > limits.k:
        shown = short_repr(n)
        raise RequestError(
            400,
            f"{param}={shown} but this server keeps the top K={limits.k} raw logits per token; ask for {param} <= {limits.k}, "
            f"or restart the server with --top-k {shown} (K also sets the K of its AU/EU; the LogTokU setting is 2)",
            param=param,
        )


def chat_messages(req: proto.CompletionRequest) -> list[ChatMessage]:
    """A completion's prompt as the conversation to answer: one user turn (a chat's turns: :func:`.tools.chat_turns`)."""
    return [ChatMessage("user", req.prompt_text)]


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


def logtoku_extra(t: TokenScore) -> proto.LogTokUToken:
    """The per-token ``logtoku`` extension: :func:`token_payload` plus ``top_ids``."""
    return proto.LogTokUToken(**token_payload(t), top_ids=list(t.top_ids))


def chat_logprob(t: TokenScore, n_top: int, text_of: TokenText) -> proto.ChatTokenLogprob:
    """One ``choices[].logprobs.content[]`` entry (values: raw logits)."""
    tops = []
    for z, i in list(zip(t.top_logits, t.top_ids))[:n_top]:
        s = t.text if i == t.id else text_of(i)
        tops.append(proto.TopLogprob(token=s, logprob=json_float(z), bytes=_bytes(s)))
    return proto.ChatTokenLogprob(
        token=t.text, logprob=chosen_logit(t), bytes=_bytes(t.text), top_logprobs=tops, logtoku=logtoku_extra(t)
    )


def _finish(g: Generation) -> str:
    return "abort" if g.finish_reason == "cancelled" else g.finish_reason


def usage(g: Generation) -> proto.Usage:
    n = len(g.tokens)
    return proto.Usage(prompt_tokens=g.prompt_tokens, completion_tokens=n, total_tokens=g.prompt_tokens + n)


def choice_extras(g: Generation, guard_result: Any = None, tool_scores: Sequence[Any] | None = None) -> dict[str, Any]:
    """The per-choice extensions: ``logtoku`` summary (and, when the answer called tools, each call's
    per-argument scores in ``logtoku.tool_calls``) and, with a policy, ``logtoku_guard``."""
    out: dict[str, Any] = {"logtoku": summary_payload(g)}
    if tool_scores is not None:
        out["logtoku"] = {**out["logtoku"], "tool_calls": list(tool_scores)}
    if guard_result is not None:
        out["logtoku_guard"] = result_payload(guard_result)
    return out


def tool_finish(g: Generation, called: bool) -> str:
    """The finish reason: ``tool_calls`` when the answer ended with a call, else the generation's."""
    return "tool_calls" if called and g.finish_reason == "stop" else _finish(g)


def chat_response(
    req: proto.ChatCompletionRequest,
    g: Generation,
    answer: str | None,
    model: str,
    text_of: TokenText,
    guard_result: Any = None,
    *,
    tool_calls: Sequence[Any] = (),
    tool_scores: Sequence[Any] | None = None,
) -> proto.ChatCompletionResponse:
    """A whole ``chat.completion`` body (``answer`` None: only ``tool_calls``)."""
    n_top = req.top_logprobs or 0
    logprobs = proto.ChatLogprobs(content=[chat_logprob(t, n_top, text_of) for t in g.tokens]) if req.logprobs else None
    choice = proto.ChatChoice(
        index=0,
        message=proto.AssistantMessage(role="assistant", content=answer, tool_calls=list(tool_calls)),
        logprobs=logprobs,
        finish_reason=tool_finish(g, bool(tool_calls)),
        stop_reason=g.stop_sequence,
        **choice_extras(g, guard_result, tool_scores),
    )
    return proto.ChatCompletionResponse(
        id=new_id("chatcmpl"), object="chat.completion", created=now(), model=model, choices=[choice], usage=usage(g)
    )


def chat_chunk(
    cid: str,
    created: int,
    model: str,
    delta: proto.DeltaMessage,
    *,
    logprobs: proto.ChatLogprobs | None = None,
    finish: Generation | None = None,
    guard_result: Any = None,
    tool_scores: Sequence[Any] | None = None,
) -> proto.ChatCompletionChunk:
    """One ``chat.completion.chunk`` (the last one, ``finish`` given, has the finish reason and extras;
    ``tool_scores`` given: the answer called tools)."""
    choice = proto.ChatChunkChoice(index=0, delta=delta, logprobs=logprobs, finish_reason=None)
    if finish is not None:
        choice = proto.ChatChunkChoice(
            index=0,
            delta=delta,
            logprobs=logprobs,
            finish_reason=tool_finish(finish, tool_scores is not None),
            stop_reason=finish.stop_sequence,
            **choice_extras(finish, guard_result, tool_scores),
        )
    return proto.ChatCompletionChunk(id=cid, object="chat.completion.chunk", created=created, model=model, choices=[choice])


def completion_logprobs(
    tokens: Sequence[TokenScore], n_top: int, text_of: TokenText, offset: int = 0
) -> proto.CompletionLogprobs:
    """The legacy ``logprobs`` object of a completion choice (values: raw logits)."""
    offsets: list[int] = []
    pieces: list[str] = []
    chosen: list[float | None] = []
    tops: list[dict[str, float | None] | None] = []
    extras: list[proto.LogTokUToken] = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.text)
        pieces.append(t.text)
        chosen.append(chosen_logit(t))
        tops.append({(t.text if i == t.id else text_of(i)): json_float(z) for z, i in list(zip(t.top_logits, t.top_ids))[:n_top]})
        extras.append(logtoku_extra(t))
    return proto.CompletionLogprobs(text_offset=offsets, token_logprobs=chosen, tokens=pieces, top_logprobs=tops, logtoku=extras)


def completion_response(
    req: proto.CompletionRequest, g: Generation, answer: str, model: str, text_of: TokenText, guard_result: Any = None
) -> proto.CompletionResponse:
    """A whole ``text_completion`` body."""
    logprobs = None if req.logprobs is None else completion_logprobs(g.tokens, req.logprobs, text_of)
    choice = proto.CompletionChoice(
        index=0,
        text=answer,
        logprobs=logprobs,
        finish_reason=_finish(g),
        stop_reason=g.stop_sequence,
        **choice_extras(g, guard_result),
    )
    return proto.CompletionResponse(
        id=new_id("cmpl"), object="text_completion", created=now(), model=model, choices=[choice], usage=usage(g)
    )


def completion_chunk(
    cid: str,
    created: int,
    model: str,
    text: str,
    *,
    logprobs: proto.CompletionLogprobs | None = None,
    finish: Generation | None = None,
    guard_result: Any = None,
) -> proto.CompletionChunk:
    choice = proto.CompletionChoice(index=0, text=text, logprobs=logprobs, finish_reason=None)
    if finish is not None:
        choice = proto.CompletionChoice(
            index=0,
            text=text,
            logprobs=logprobs,
            finish_reason=_finish(finish),
            stop_reason=finish.stop_sequence,
            **choice_extras(finish, guard_result),
        )
    return proto.CompletionChunk(id=cid, object="text_completion", created=created, model=model, choices=[choice])


def models_response(names: Sequence[str], owner: str = "logtoku-guard") -> proto.ModelList:
    created = now()
    return proto.ModelList(
        object="list", data=[proto.ModelCard(id=n, object="model", created=created, owned_by=owner) for n in names]
    )
