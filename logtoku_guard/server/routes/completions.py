"""``POST /v1/chat/completions`` and ``POST /v1/completions`` (the legacy API): one answer, or its stream.

A request is checked before anything is generated and before any stream opens, so every refusal
is a JSON error with its 4xx status, streamed or not: the model name, the decoding options within
the server's limits, the logit parameters the backend can apply, the tools, and whether the prompt
fits the model's context window (:func:`check_fits`: a prompt that fills it, or a ``max_tokens``
the request sent that does not fit after it, is a 400 naming the numbers, as vLLM answers).
Then the answer is made (with a policy: guarded, its tool calls gated by
:mod:`~logtoku_guard.server.gate`) while the client is watched (a client that goes away stops
its generation), or streamed as server-sent events (:mod:`~logtoku_guard.server.sse`).
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations (Request, the bodies) at run time.

import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from logtoku_guard.errors import LogTokUError
from logtoku_guard.server import gate, refusal, sse, tools, wire
from logtoku_guard.server.engine import ClientGone, while_connected
from logtoku_guard.server.state import Serving, error_response, library_error, serving_of
from logtoku_guard.types import ChatMessage
from logtoku_guard.wire import openai_protocol as proto

__all__ = ["ClosingStreamingResponse", "chat_completions", "check_fits", "completions", "handle", "router"]

router = APIRouter()


@router.post("/v1/chat/completions", response_model=proto.ChatCompletionResponse, responses=wire.ERROR_RESPONSES)
async def chat_completions(body: proto.ChatCompletionRequest, request: Request) -> Any:
    """A chat answer with log-probabilities and LogTokU scores per token; ``stream: true`` answers as
    server-sent events of :class:`ChatCompletionChunk` ending with ``data: [DONE]``."""
    return await handle(body, request)


@router.post("/v1/completions", response_model=proto.CompletionResponse, responses=wire.ERROR_RESPONSES)
async def completions(body: proto.CompletionRequest, request: Request) -> Any:
    """A completion of one prompt (the legacy API); ``stream: true`` answers as server-sent events."""
    return await handle(body, request)


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


async def handle(req: wire.AnyRequest, request: Request) -> Any:
    """Answer one chat or completion request (a JSON body, or a stream once every check passed)."""
    serving = serving_of(request)
    backend = serving.backend
    started = time.perf_counter()
    tally = serving.tally("chat" if isinstance(req, proto.ChatCompletionRequest) else "completions", started)
    try:
        wire.check_model(req.model, serving.names)
        options = wire.decoding_options(req, serving.limits)
        wire.check_backend_params(req, options, backend)
        plan = tools.NO_TOOLS
        if isinstance(req, proto.ChatCompletionRequest):
            plan = tools.plan(req, backend)
            messages = tools.chat_turns(req, plan)
            options = options.replace(constraint=plan.constraint)
        else:
            messages = wire.chat_messages(req)
        await check_fits(serving, req, messages)
        if req.stream:  # every check above is answered as JSON: nothing is refused once the stream opens
            events = sse.events(
                serving.engine, req, messages, options, serving.model, serving.text_of, plan, serving.limits.logprobs_mode, tally
            )
            return ClosingStreamingResponse(
                events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            )
        engine = serving.engine
        if isinstance(req, proto.ChatCompletionRequest):
            gated = await while_connected(request, lambda cancel: gate.answer_gated(engine, plan, messages, options, cancel))
            answer = gated.answer
        else:
            answer = await while_connected(request, lambda cancel: engine.answer(messages, options, cancel))
    except ClientGone:
        tally.refused(499)
        return Response(status_code=499)  # nobody reads it: the client went away
    except wire.RequestError as exc:
        tally.refused(exc.status)
        return error_response(exc)
    except LogTokUError as exc:
        response = library_error(exc)
        tally.refused(response.status_code, getattr(exc, "result", None))
        return response
    tally.answered(answer)
    mode = serving.limits.logprobs_mode
    if isinstance(req, proto.ChatCompletionRequest):
        out, held = gated.reply, gated.withheld_calls
        body: Any = wire.chat_response(
            req,
            answer.generation,
            out.content,
            serving.model,
            serving.text_of,
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
        text, g = answer.text, answer.generation
        body = wire.completion_response(
            req, g, text, serving.model, serving.text_of, answer.guard_result, mode=mode, answer_tokens=sent
        )
    return Response(sse.json_body(body), media_type="application/json", headers=refusal.decision_headers(answer.guard_result))


async def check_fits(serving: Serving, req: wire.AnyRequest, messages: list[ChatMessage]) -> None:
    """Refuse, before anything is generated, a request that cannot fit the model's context window.

    A prompt that fills the window is the backend's
    :class:`~logtoku_guard.errors.PromptTooLongError` (a 400). A ``max_tokens`` (or
    ``max_completion_tokens``) the request sent that does not fit after the prompt is a 400 naming
    the prompt's tokens, the window and the most that fits, as vLLM refuses it; a default one
    (the request sent none) is cut to what fits by the backend. A backend that cannot count a
    prompt's tokens or has no window (a remote server, which checks its own) is not checked here.
    """
    backend = serving.backend
    length = getattr(backend, "prompt_length", None)
    context = getattr(backend, "context_window", None)
    if not callable(length) or not isinstance(context, int):
        return
    prompt_tokens = int(await anyio.to_thread.run_sync(length, messages))  # tokenising: off the event loop
    asked = req.requested_max_tokens
    if asked is not None and prompt_tokens + asked > context:
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        msg = (
            f"{param}={asked} does not fit: this model's context window is {context} tokens and the prompt takes "
            f"{prompt_tokens} ({prompt_tokens} + {asked} > {context}); ask for {param} <= {context - prompt_tokens}, "
            "or shorten the prompt"
        )
        raise wire.RequestError(400, msg, param=param)
