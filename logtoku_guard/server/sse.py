"""A streamed answer as server-sent events: one chunk per token, a last chunk with the extras, ``[DONE]``.

Under a policy nothing is sent before the guard has decided (the answer is made whole by
:meth:`~logtoku_guard.server.engine.Engine.answer`, its tool calls gated by
:mod:`~logtoku_guard.server.gate`), then sent: a withheld draft never reaches the client. Its
first chunk is ``{"role": "assistant"}`` alone (the answer may yet be content or a refusal); a
withheld chat answer then comes as one ``delta.refusal`` chunk (with ``logprobs``
``{"content": [], "refusal": []}`` when they were asked), and the last chunk's ``finish_reason``
is ``stop``, as OpenAI streams a refusal.
Unguarded, each token is sent as it is generated and a client that hangs up stops the generation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.server import gate, refusal, tools, wire
from logtoku_guard.server.engine import Answer, ClientGone, Engine
from logtoku_guard.server.metrics import Tally
from logtoku_guard.types import ChatMessage, DecodingOptions, TokenScore
from logtoku_guard.wire import openai_protocol as proto

__all__ = ["events", "json_body", "sse_data"]

logger = logging.getLogger(__name__)


def json_body(body: Any) -> bytes:
    """A response model's JSON: the fields it was built with (an extra left unset is left out, as vLLM does)."""
    if isinstance(body, dict):
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return body.model_dump_json(exclude_unset=True).encode()


def sse_data(obj: Any) -> bytes:
    return b"data: " + json_body(obj) + b"\n\n"


async def events(
    engine: Engine,
    req: wire.AnyRequest,
    messages: list[ChatMessage],
    options: DecodingOptions,
    model: str,
    text_of: wire.TokenText,
    plan: tools.ToolPlan = tools.NO_TOOLS,
    mode: wire.LogprobsMode = "raw_logprobs",
    tally: Tally | None = None,
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
    offset = 0
    answer: Answer | None = None
    guarded = engine.policy is not None
    if chat:  # guarded: the answer may yet be a refusal, so no content is promised
        first = proto.DeltaMessage(role="assistant") if guarded else proto.DeltaMessage(role="assistant", content="")
        yield sse_data(wire.chat_chunk(cid, created, model, first))
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
        from logtoku_guard.decision.results import GuardRejectedError
        from logtoku_guard.wire.payloads import served_decision_payload

        extra = {"logtoku_guard": served_decision_payload(exc.result)} if isinstance(exc, GuardRejectedError) else None
        status = 422 if extra else 400 if isinstance(exc, ConfigurationError) else 500
        if status == 500:
            logger.error("generation failed: %s", exc, exc_info=exc)
        if tally is not None:
            tally.refused(status, exc.result if isinstance(exc, GuardRejectedError) else None)
        yield sse_data(wire.error_body(str(exc), status, extra=extra))
        yield b"data: [DONE]\n\n"
        return
    except Exception as exc:  # the status line is sent: the client learns of the failure in the stream
        logger.error("generation failed: %s", exc, exc_info=exc)
        if tally is not None:
            tally.refused(500)
        yield sse_data(wire.error_body(f"generation failed: {exc.__class__.__name__}: {exc}", 500))
        yield b"data: [DONE]\n\n"
        return
    if answer is None:  # the generation ended without a result: cannot happen unless cancelled
        return
    g = answer.generation
    if tally is not None:
        tally.answered(answer)
    held = gated is not None and gated.withheld_calls
    out = gated.reply if gated is not None else gate.reply_of(plan, answer)
    sent = wire.answer_tokens(engine.backend, answer.guard_result, answer.text, out.content if held else None)
    refused = refusal.withheld(answer.guard_result)
    replaced = guarded and (refused or answer.text != g.text or held)
    if guarded and not replaced:  # the guard passed the draft: its tokens, as an unguarded stream sends them
        for t in g.tokens:
            chunk = _token_chunk(req, cid, created, model, t, offset, text_of, prose, mode)
            if chunk:
                yield chunk
            offset += len(t.text)
    if refused and chat:  # the guard withheld the draft: its message on the refusal channel
        lp = refusal.withheld_logprobs() if req.logprobs else None
        yield sse_data(wire.chat_chunk(cid, created, model, proto.DeltaMessage(refusal=answer.text), logprobs=lp))
    elif replaced:  # the guard replaced the answer (warn, a call held back; a legacy completion): one chunk with its text
        text = out.content if chat else answer.text
        if text or not chat:
            lp_chat = proto.ChatLogprobs(content=[]) if chat and req.logprobs and held else None
            yield sse_data(
                wire.chat_chunk(cid, created, model, proto.DeltaMessage(content=text), logprobs=lp_chat)
                if chat
                else wire.completion_chunk(
                    cid, created, model, answer.text, logprobs=_empty_completion_logprobs(req, text_of, mode) if refused else None
                )
            )
    elif prose is not None and not out.tool_calls and len(prose.text) > prose.sent:  # no call after all: the held text
        yield sse_data(wire.chat_chunk(cid, created, model, proto.DeltaMessage(content=prose.text[prose.sent :])))
    if out.tool_calls:
        yield sse_data(wire.chat_chunk(cid, created, model, proto.DeltaMessage(tool_calls=tools.call_deltas(out.tool_calls))))
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
    yield sse_data(final)
    if req.include_usage:
        yield sse_data(final.model_copy(update={"choices": [], "usage": wire.usage(g, answer.guard_result, sent)}))
    yield b"data: [DONE]\n\n"


def _empty_completion_logprobs(
    req: wire.AnyRequest, text_of: wire.TokenText, mode: wire.LogprobsMode
) -> proto.CompletionLogprobs | None:
    """A withheld legacy completion's ``logprobs`` when asked: empty lists (no draft token), not null."""
    if isinstance(req, proto.ChatCompletionRequest) or req.logprobs is None:
        return None
    return wire.completion_logprobs((), req.logprobs, text_of, mode=mode)


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
        return sse_data(wire.chat_chunk(cid, created, model, delta, logprobs=lp))
    clp = None if req.logprobs is None else wire.completion_logprobs([t], req.logprobs, text_of, offset, mode)
    return sse_data(wire.completion_chunk(cid, created, model, t.text, logprobs=clp))
