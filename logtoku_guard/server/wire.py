"""The server's side of the wire protocol: settings-dependent checks and the response bodies.

The bodies themselves are the pydantic models of :mod:`logtoku_guard.wire.openai_protocol` (FastAPI
parses the requests into them); this module adds what depends on the server (the largest
``max_tokens``, the K of its top-K logits, the served model's name), turns a request into
:class:`~logtoku_guard.types.DecodingOptions` and chat messages, and builds the response models
from a :class:`~logtoku_guard.types.Generation`. Every refusal is a :class:`RequestError`
carrying the HTTP status and an OpenAI error body.

Token strings: a chosen token is written as the exact text piece it added to the answer (so the
pieces concatenate to ``content``; a piece is ``""`` while a UTF-8 character is incomplete);
an alternative in ``top_logprobs`` as ``decode([id])``, or ``"token_id:<id>"`` (vLLM's form)
when the backend has no tokenizer.

Log-probabilities (:data:`LOGPROBS_MODES`, vLLM's names): by default (``raw_logprobs``) every
``logprob`` is what OpenAI's spec says, a log-probability of the full softmax of the model's raw
logits: the chosen token's is always known; its alternatives' share the normaliser the chosen
token gives away, for up to 20 alternatives the backend kept (``max_logprobs``; none when a
sampled token falls outside them). ``raw_logits`` (``serve --logprobs-mode raw_logits``, for
vLLM-style clients) writes the raw logits there instead, ``null`` for a chosen token outside the
kept ones. Either way the raw top-K logits, AU, EU and ids are in each token's ``logtoku``
extension.

A withheld answer goes on OpenAI's refusal channel (:mod:`~logtoku_guard.server.refusal`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import short_repr
from logtoku_guard.server.limits import (  # re-exported: the limits a request is held to (limits.py)
    CALIBRATION_MAX_TOKENS as CALIBRATION_MAX_TOKENS,
)
from logtoku_guard.server.limits import LOGPROBS_MODES as LOGPROBS_MODES
from logtoku_guard.server.limits import (
    OPENAI_MAX_TOP_LOGPROBS,
    Limits,
    LogprobsMode,
)
from logtoku_guard.server.limits import kept_alternatives as kept_alternatives
from logtoku_guard.server.refusal import chat_message, completion_finish, tool_finish, withheld, withheld_logprobs
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, TokenScore
from logtoku_guard.wire import openai_protocol as proto
from logtoku_guard.wire.payloads import json_float, served_decision_payload, summary_payload, token_payload

if TYPE_CHECKING:
    from logtoku_guard.decision.results import GuardResult

TokenText = Callable[[int], str]
"""Decodes one token id into its text (for the alternatives in ``top_logprobs``)."""

AnyRequest = proto.ChatCompletionRequest | proto.CompletionRequest


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` and an OpenAI error body (``code``: a string or None,
    by default the status's in :data:`ERROR_CODES`)."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, kind: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or _ERROR_TYPES.get(status, "invalid_request_error")
        self.code = code

    def body(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return error_body(self.message, self.status, param=self.param, kind=self.kind, extra=extra, code=self.code)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "guard_rejected",
    500: "internal_error",
    503: "service_unavailable",
}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": proto.ErrorResponse, "description": text}
    for status, text in (
        (400, "Invalid request (OpenAI error body)"),
        (401, "Missing or wrong API key"),
        (404, "Unknown model"),
        (413, "Request body over the server's limit"),
        (422, "Refused by the guard's policy (raise action); the decision is in error.logtoku_guard"),
    )
}
"""The error responses the ``/v1`` routes document in ``GET /openapi.json``."""


ERROR_CODES: dict[int, str] = {
    401: "invalid_api_key",
    413: "request_too_large",
    422: "guard_rejected",
    499: "client_closed_request",
    503: "service_unavailable",
}
"""The ``code`` of an error body by HTTP status, where no more precise one is given (else ``null``, as OpenAI's
many invalid-request errors): OpenAI's ``code`` is a string or null, never the status."""


def error_body(
    message: str,
    status: int,
    *,
    param: str | None = None,
    kind: str | None = None,
    extra: Mapping[str, Any] | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` (:class:`~.openai_protocol.ErrorResponse`;
    ``code``: a string or None, by default :data:`ERROR_CODES`' for ``status``)."""
    info = proto.ErrorInfo(
        message=message,
        type=kind or _ERROR_TYPES.get(status, "invalid_request_error"),
        param=param,
        code=code if code is not None else ERROR_CODES.get(status),
        **(extra or {}),
    )
    return proto.ErrorResponse(error=info).model_dump(mode="json", exclude_unset=True)  # no logtoku_guard unless given


# -- requests: what depends on the server's settings ----------------------------------------------
def check_model(model: str | None, served: Sequence[str]) -> None:
    """404 unless ``model`` (when given) names the served model."""
    if model is not None and model not in served:
        raise RequestError(
            404,
            f"the model {short_repr(model)} does not exist on this server; it serves {served[0]!r} (see GET /v1/models)",
            param="model",
            kind="invalid_request_error",
            code="model_not_found",
        )


def check_backend_params(req: AnyRequest, options: DecodingOptions, backend: Backend) -> None:
    """400 naming the parameter when the backend cannot apply a logit parameter the request sets
    (:func:`~logtoku_guard.backends.processors.unsupported_logit_param`), or ``logit_bias`` names a token id
    outside the served model's vocabulary."""
    from logtoku_guard.backends.processors import unsupported_logit_param

    name = unsupported_logit_param(options, backend)
    if name is not None:
        msg = (
            f"{name} is set but this server's {type(backend).__name__} backend cannot apply it to its logits; leave it "
            "out, or serve the model on the transformers or llama.cpp backend (or a remote server that applies it)"
        )
        raise RequestError(400, msg, param=name, code="unsupported_parameter")
    vocab_size = getattr(backend, "vocab_size", None)
    if not isinstance(vocab_size, int):
        return
    for token, _ in req.logit_bias_pairs:
        if token >= vocab_size:
            raise RequestError(
                400,
                f"logit_bias names token {token}, outside this model's vocabulary of {vocab_size} tokens (ids 0 to "
                f"{vocab_size - 1})",
                param="logit_bias",
            )


def decoding_options(req: AnyRequest, limits: Limits) -> DecodingOptions:
    """The request's decoding options, within the server's ``max_tokens`` and top-K (raises :class:`RequestError`).

    A field the request leaves out takes the server's default, the same for a chat and a legacy
    completion request: ``temperature`` ``limits.default_temperature`` (0, greedy, unless ``serve
    --default-temperature`` says otherwise), ``max_tokens`` :attr:`Limits.omitted_max_tokens` (the
    length the guard was calibrated on unless ``--default-max-tokens`` says otherwise). A field it
    sends always wins."""
    max_tokens = req.requested_max_tokens
    if max_tokens is None:
        max_tokens = limits.omitted_max_tokens
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
        temperature=limits.default_temperature if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed,
        stop=req.stop_strings,
        logit_bias=req.logit_bias_pairs,
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
    )


def _check_top(n: int, limits: Limits, param: str) -> None:
    if n > limits.max_top_logprobs:
        shown = short_repr(n)
        why = (
            "OpenAI's limit"
            if limits.max_top_logprobs >= OPENAI_MAX_TOP_LOGPROBS
            else "what this server's backend keeps per token (its max_logprobs)"
        )
        raise RequestError(
            400,
            f"{param}={shown} is above {limits.max_top_logprobs}, {why}; ask for {param} <= {limits.max_top_logprobs}",
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


def _kept(t: TokenScore) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The token's kept alternatives, largest first: the backend's wider ``alt_*`` when it keeps them, else the top K."""
    return (t.alt_ids, t.alt_logits) if t.alt_ids else (t.top_ids, t.top_logits)


def chosen_logit(t: TokenScore) -> float | None:
    """The chosen token's raw logit when it is among the kept alternatives (else ``None``)."""
    ids, logits = _kept(t)
    for z, i in zip(logits, ids):
        if i == t.id:
            return json_float(z)
    return None


def alternatives(t: TokenScore, n: int, mode: LogprobsMode) -> list[tuple[int, float | None]]:
    """The ``n`` likeliest alternatives of ``t`` as ``(id, value)``: log-probabilities, or raw logits in ``raw_logits`` mode."""
    if n <= 0:
        return []
    if mode == "raw_logits":
        ids, logits = _kept(t)
        return [(i, json_float(z)) for i, z in zip(ids[:n], logits[:n])]
    return [(i, json_float(lp)) for i, lp in t.top_logprobs(n)]


def chosen_value(t: TokenScore, mode: LogprobsMode) -> float | None:
    """The chosen token's ``logprob``: its log-probability (always known), or its raw logit in ``raw_logits`` mode."""
    return chosen_logit(t) if mode == "raw_logits" else json_float(t.logprob)


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def logtoku_extra(t: TokenScore) -> proto.LogTokUToken:
    """The per-token ``logtoku`` extension: :func:`token_payload` plus ``top_ids``."""
    return proto.LogTokUToken(**token_payload(t), top_ids=list(t.top_ids))


def chat_logprob(t: TokenScore, n_top: int, text_of: TokenText, mode: LogprobsMode = "raw_logprobs") -> proto.ChatTokenLogprob:
    """One ``choices[].logprobs.content[]`` entry (values: log-probabilities, or raw logits in ``raw_logits`` mode)."""
    tops = []
    for i, value in alternatives(t, n_top, mode):
        s = t.text if i == t.id else text_of(i)
        tops.append(proto.TopLogprob(token=s, logprob=value, bytes=_bytes(s)))
    return proto.ChatTokenLogprob(
        token=t.text, logprob=chosen_value(t, mode), bytes=_bytes(t.text), top_logprobs=tops, logtoku=logtoku_extra(t)
    )


def answer_tokens(backend: Backend, guard_result: GuardResult | None, text: str, replaced: str | None = None) -> int | None:
    """``None`` when the client gets the draft; else the token count of the text it gets instead (the
    guard's message ``text``, or ``replaced``: the content left once the ``tool_calls`` rules held a call
    back), counted with the backend's tokenizer (0 for a backend without one), for ``usage``."""
    if not withheld(guard_result) and replaced is None:
        return None
    sent = text if withheld(guard_result) else replaced or ""
    count = getattr(backend, "count_tokens", None)
    return int(count(sent)) if callable(count) and sent else 0


def usage(g: Generation, guard_result: Any = None, answer_tokens: int | None = None) -> proto.Usage:
    """Token counts of what the client gets: the generation's, or ``answer_tokens`` (the answer sent)
    when it is not the generation (a withheld draft or call)."""
    n = answer_tokens if answer_tokens is not None else len(g.tokens)
    return proto.Usage(prompt_tokens=g.prompt_tokens, completion_tokens=n, total_tokens=g.prompt_tokens + n)


def choice_extras(
    g: Generation,
    guard_result: Any = None,
    tool_scores: Sequence[Any] | None = None,
    *,
    prompt_scores: bool = False,
    held: bool = False,
    decision_extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The per-choice extensions: ``logtoku`` summary (and, when the answer called tools, each call's
    per-argument scores in ``logtoku.tool_calls``; with ``prompt_scores``, the question's tokens scored at
    the prefill in ``logtoku.prompt_scores``, what a remote guard needs) and, with a policy,
    ``logtoku_guard`` (plus ``decision_extra``: each tool call's decision). A withheld answer, or one
    whose call was ``held`` back by the ``tool_calls`` rules, has no ``logtoku``: it would describe the draft."""
    out: dict[str, Any] = {}
    if not (withheld(guard_result) or held):
        summary: dict[str, Any] = dict(summary_payload(g))
        if tool_scores is not None:
            summary["tool_calls"] = list(tool_scores)
        if prompt_scores and g.prompt_scores:
            summary["prompt_scores"] = [logtoku_extra(t) for t in g.prompt_scores]
        out["logtoku"] = summary
    if guard_result is not None:
        out["logtoku_guard"] = {**served_decision_payload(guard_result), **(decision_extra or {})}
    return out


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
    mode: LogprobsMode = "raw_logprobs",
    answer_tokens: int | None = None,
    held: bool = False,
    decision_extra: Mapping[str, Any] | None = None,
) -> proto.ChatCompletionResponse:
    """A whole ``chat.completion`` body (``answer`` None: only ``tool_calls``; ``answer_tokens``: the
    answer's token count, for ``usage`` when the guard withheld the draft; ``held``: the ``tool_calls``
    rules held a call back, so nothing token-level of the draft may be sent)."""
    n_top = req.top_logprobs or 0
    hidden = withheld(guard_result) or held
    logprobs = None
    if req.logprobs and withheld(guard_result):
        logprobs = withheld_logprobs()
    elif req.logprobs and held:  # the content is the kept prose and the notes: no token of the generation
        logprobs = proto.ChatLogprobs(content=[])
    elif req.logprobs:
        logprobs = proto.ChatLogprobs(content=[chat_logprob(t, n_top, text_of, mode) for t in g.tokens])
    choice = proto.ChatChoice(
        index=0,
        message=chat_message(answer, guard_result, tool_calls),
        logprobs=logprobs,
        finish_reason=tool_finish(g, bool(tool_calls), guard_result, held),
        stop_reason=None if hidden else g.stop_sequence,
        **choice_extras(g, guard_result, tool_scores, prompt_scores=True, held=held, decision_extra=decision_extra),
    )
    return proto.ChatCompletionResponse(
        id=new_id("chatcmpl"),
        object="chat.completion",
        created=now(),
        model=model,
        choices=[choice],
        usage=usage(g, guard_result, answer_tokens),
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
    held: bool = False,
    decision_extra: Mapping[str, Any] | None = None,
) -> proto.ChatCompletionChunk:
    """One ``chat.completion.chunk`` (the last one, ``finish`` given, has the finish reason and extras;
    ``tool_scores`` given: the answer called tools)."""
    choice = proto.ChatChunkChoice(index=0, delta=delta, logprobs=logprobs, finish_reason=None)
    if finish is not None:
        choice = proto.ChatChunkChoice(
            index=0,
            delta=delta,
            logprobs=logprobs,
            finish_reason=tool_finish(finish, tool_scores is not None, guard_result, held),
            stop_reason=None if withheld(guard_result) or held else finish.stop_sequence,
            **choice_extras(finish, guard_result, tool_scores, prompt_scores=True, held=held, decision_extra=decision_extra),
        )
    return proto.ChatCompletionChunk(id=cid, object="chat.completion.chunk", created=created, model=model, choices=[choice])


def completion_logprobs(
    tokens: Sequence[TokenScore], n_top: int, text_of: TokenText, offset: int = 0, mode: LogprobsMode = "raw_logprobs"
) -> proto.CompletionLogprobs:
    """The legacy ``logprobs`` object of a completion choice (values: log-probabilities, or raw logits in ``raw_logits`` mode)."""
    offsets: list[int] = []
    pieces: list[str] = []
    chosen: list[float | None] = []
    tops: list[dict[str, float | None] | None] = []
    extras: list[proto.LogTokUToken] = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.text)
        pieces.append(t.text)
        chosen.append(chosen_value(t, mode))
        tops.append({(t.text if i == t.id else text_of(i)): value for i, value in alternatives(t, n_top, mode)})
        extras.append(logtoku_extra(t))
    return proto.CompletionLogprobs(text_offset=offsets, token_logprobs=chosen, tokens=pieces, top_logprobs=tops, logtoku=extras)


def completion_response(
    req: proto.CompletionRequest,
    g: Generation,
    answer: str,
    model: str,
    text_of: TokenText,
    guard_result: Any = None,
    *,
    mode: LogprobsMode = "raw_logprobs",
    answer_tokens: int | None = None,
) -> proto.CompletionResponse:
    """A whole ``text_completion`` body."""
    hidden = withheld(guard_result)
    logprobs = None
    if req.logprobs is not None:  # asked for: a withheld answer's are empty lists, not null
        logprobs = completion_logprobs(() if hidden else g.tokens, req.logprobs, text_of, mode=mode)
    choice = proto.CompletionChoice(
        index=0,
        text=answer,
        logprobs=logprobs,
        finish_reason=completion_finish(g, guard_result),
        stop_reason=None if hidden else g.stop_sequence,
        **choice_extras(g, guard_result),
    )
    return proto.CompletionResponse(
        id=new_id("cmpl"),
        object="text_completion",
        created=now(),
        model=model,
        choices=[choice],
        usage=usage(g, guard_result, answer_tokens),
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
            finish_reason=completion_finish(finish, guard_result),
            stop_reason=None if withheld(guard_result) else finish.stop_sequence,
            **choice_extras(finish, guard_result),
        )
    return proto.CompletionChunk(id=cid, object="text_completion", created=created, model=model, choices=[choice])


def models_response(names: Sequence[str], owner: str = "logtoku-guard") -> proto.ModelList:
    created = now()
    return proto.ModelList(
        object="list", data=[proto.ModelCard(id=n, object="model", created=created, owned_by=owner) for n in names]
    )
