"""The OpenAI-compatible wire protocol, as pydantic models: OpenAI's and vLLM's JSON, plus LogTokU extras.

One definition of every body that crosses the wire, used by both ends: ``logtoku-guard serve``
(FastAPI parses and documents the requests, and the responses are built from these models) and
:class:`~logtoku_guard.backends.openai_compat.OpenAICompatibleBackend` (it builds its request
and reads vLLM's or our server's responses with them). No web framework is imported here.

Requests (:class:`ChatCompletionRequest`, :class:`CompletionRequest`) are strict: a JSON
``true`` is not an integer, ``"1"`` is not a number, numbers must be finite, ``seed`` is 0 to
2**64 - 1. What depends on the server's settings (the largest ``max_tokens``, ``top_logprobs``
<= the alternatives kept, the served model name) is checked by the server after parsing. Unknown fields are ignored,
as OpenAI clients send many. :func:`describe_errors` turns a validation error into one sentence
naming the field, the value and what is accepted.

Responses follow OpenAI's shape: every ``logprob`` is a log-probability (a server in vLLM's
``--logprobs-mode raw_logits`` puts raw logits there instead; :mod:`logtoku_guard.server.wire`).
Extensions an OpenAI client ignores: each chat ``logprobs.content[]`` entry has ``logtoku``
(:class:`LogTokUToken`: the raw top-K logits, AU, EU, the full-softmax log p and entropy, token
ids); a completion's ``logprobs.logtoku`` is the same list; each choice has ``logtoku`` (the
response summary, with the question's own tokens scored in ``prompt_scores``) and, under a policy,
``logtoku_guard`` (the guard's decision, never the withheld draft). Response models ignore fields
they do not know (vLLM sends many).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator
from pydantic import ValidationError as ValidationError  # re-exported: what parsing a body raises

from logtoku_guard.errors import short_repr
from logtoku_guard.wire import openai_tools as tw  # the tool-call models (tw: tools on the wire)
from logtoku_guard.wire.openai_errors import WireValueError as WireValueError  # re-exported: what the models' rules raise
from logtoku_guard.wire.openai_errors import describe_errors as _describe
from logtoku_guard.wire.openai_params import MAX_STOP as MAX_STOP  # re-exported: the most stop strings
from logtoku_guard.wire.openai_params import StandardParams as StandardParams  # re-exported: the standard fields' rules
from logtoku_guard.wire.openai_tools import LogTokUToken as LogTokUToken  # re-exported: the per-token extension
from logtoku_guard.wire.payloads import ServedDecisionPayload, SummaryPayload

__all__ = [
    "MAX_STOP",
    "SEED_MAX",
    "AssistantMessage",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatLogprobs",
    "ChatMessageParam",
    "ChatTokenLogprob",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionResponse",
    "DeltaMessage",
    "ErrorInfo",
    "ErrorResponse",
    "LogTokUToken",
    "ModelCard",
    "ModelList",
    "ReviewVerdict",
    "StandardParams",
    "StreamOptions",
    "TextPart",
    "TopLogprob",
    "Usage",
    "ValidationError",
    "WireValueError",
    "describe_errors",
]

SEED_MAX = 2**64 - 1
"""The largest ``seed`` (64 bits, what the random number generator takes)."""


# -- requests ----------------------------------------------------------------------------------
_REQUEST = ConfigDict(strict=True, extra="ignore")


class TextPart(BaseModel):
    """A content part of a chat message (only text parts are supported)."""

    model_config = _REQUEST
    type: Literal["text"]
    text: StrictStr


class ChatMessageParam(BaseModel):
    """One chat turn: ``content`` is a string or a list of text parts (joined).

    History of tool use: an ``assistant`` turn may carry ``tool_calls`` (its ``content`` may
    then be null), and a ``tool`` turn is a tool's result for the call ``tool_call_id``.
    """

    model_config = _REQUEST
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    tool_calls: list[tw.ToolCall] | None = Field(default=None, description="The calls an assistant turn made.")
    tool_call_id: StrictStr | None = Field(default=None, description="A tool turn: the id of the call it answers.")

    @model_validator(mode="after")
    def _check(self) -> ChatMessageParam:
        if self.tool_calls and self.role != "assistant":
            raise WireValueError(f"only an assistant message may carry tool_calls, not a {self.role!r} one", "messages")
        if (self.role == "tool") != (self.tool_call_id is not None):
            msg = "a tool message needs tool_call_id (the id of the call it answers), and only a tool message has one"
            raise WireValueError(msg, "messages")
        for call in self.tool_calls or ():
            try:
                arguments = call.parsed_arguments
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                got = short_repr(call.function.arguments)
                msg = f"tool call {call.id!r}: function.arguments must be a JSON object written as a string, got {got}"
                raise WireValueError(msg, "messages")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = _REQUEST
    include_usage: StrictBool | None = Field(default=False, description="Send a last chunk with the token counts.")


class _SamplingRequest(StandardParams):
    """The fields both endpoints share (the standard ones that act on the logits or are refused: :class:`StandardParams`)."""

    model_config = _REQUEST
    model: StrictStr | None = Field(default=None, description="The served model's name (see GET /v1/models); may be left out.")
    max_tokens: StrictInt | None = Field(default=None, ge=1, description="Largest number of tokens to generate.")
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, description="Alias of max_tokens (wins over it).")
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="0 = greedy; default 1.")
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False, description="Nucleus sampling mass; default 1.")
    seed: StrictInt | None = Field(default=None, ge=0, le=SEED_MAX, description="Makes sampling repeatable (0 to 2**64 - 1).")
    stop: StrictStr | list[StrictStr] | None = Field(default=None, description="Generation stops before any of these strings.")
    n: StrictInt | None = Field(default=1, description="Choices per request: this server returns one (n=1).")
    stream: StrictBool | None = Field(default=False, description="Answer as server-sent events, one chunk per token.")
    stream_options: StreamOptions | None = None
    best_of: StrictInt | None = Field(default=None, description="Not supported beyond 1: leave it out.")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            msg = f"n={short_repr(n)}: this server returns one choice per request; send n=1 (or several requests)"
            raise WireValueError(msg, "n")
        return n

    @field_validator("best_of", mode="before")
    @classmethod
    def _no_best_of(cls, best_of: Any) -> Any:
        if best_of is not None and (best_of is True or best_of != 1):
            raise WireValueError(f"best_of={short_repr(best_of)} is not supported; leave it out", "best_of")
        return best_of

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        strings = [stop] if isinstance(stop, str) else stop or []
        if not all(strings):
            msg = f"stop strings must not be empty, got {short_repr(strings)}"
            raise WireValueError(msg, "stop")
        if len(strings) > MAX_STOP:
            msg = f"stop holds at most {MAX_STOP} strings (as OpenAI's), got {len(strings)}: {short_repr(strings)}"
            raise WireValueError(msg, "stop")
        return stop

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessageParam] = Field(min_length=1, description="The conversation, oldest turn first.")
    logprobs: StrictBool | None = Field(
        default=False, description="Return each token's log-probability and its top_logprobs alternatives in logprobs.content."
    )
    top_logprobs: StrictInt | None = Field(default=None, ge=0, description="Alternatives per token (at most 20).")
    tools: list[tw.ToolParam] | None = Field(default=None, description=f"Functions the model may call (at most {tw.MAX_TOOLS}).")
    tool_choice: tw.ToolChoice | None = Field(
        default=None,
        description="'none', 'auto' (the default with tools: prose or a call), 'required' (one call of any tool) or "
        "{'type': 'function', 'function': {'name': ...}} (one call of that tool). Calls are decoded under the tools' schemas.",
    )
    parallel_tool_calls: StrictBool | None = Field(default=None, description="Accepted; an answer makes at most one call.")
    response_format: tw.ResponseFormat | None = Field(
        default=None,
        description="{'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'json_schema': {'name', 'schema'}}: "
        "the answer is decoded under the schema.",
    )

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        for i, m in enumerate(self.messages):
            if m.content is None and not (m.role == "assistant" and m.tool_calls):
                msg = f"messages[{i}].content is required (only an assistant message with tool_calls may leave it out)"
                raise WireValueError(msg, "messages")
        if not any(m.text.strip() or m.tool_calls for m in self.messages if m.role != "system"):
            raise WireValueError("every user/assistant message is empty; add the question as a user message", "messages")
        if self.top_logprobs is not None and not self.logprobs:
            raise WireValueError("top_logprobs needs logprobs=true", "top_logprobs")
        tw.check_tool_fields(self.tools, self.tool_choice, self.response_format)
        return self


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions`` (one prompt per request)."""

    prompt: StrictStr | list[StrictStr] = Field(description="The text to complete: one string (or a list of one).")
    logprobs: StrictInt | None = Field(default=None, ge=0, description="Alternatives per token (at most 20).")
    echo: StrictBool | None = Field(default=False, description="Not supported: leave it out.")
    suffix: StrictStr | None = Field(default=None, description="Not supported: leave it out.")

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise WireValueError(f"prompt must be one string (one prompt per request), got {short_repr(prompt)}", "prompt")
        text = prompt if isinstance(prompt, str) else prompt[0]
        if not text.strip():
            raise WireValueError("prompt is empty; send the text to complete", "prompt")
        return prompt

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool | None) -> bool | None:
        if echo:
            raise WireValueError("echo=true is not supported; leave it out", "echo")
        return echo

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix is not None:
            raise WireValueError("suffix is not supported; leave it out", "suffix")
        return suffix

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# -- responses ---------------------------------------------------------------------------------
_RESPONSE = ConfigDict(extra="ignore")


class TopLogprob(BaseModel):
    """One alternative: its text, ``logprob`` and UTF-8 bytes.

    ``logprob`` is a log-probability (a raw logit from a server in vLLM's ``raw_logits`` mode)."""

    model_config = _RESPONSE
    token: str
    logprob: float | None
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    """One generated token of a chat answer, its top alternatives and (from this server) ``logtoku``.

    ``logprob`` is the chosen token's log-probability (in vLLM's ``raw_logits`` mode its raw logit, ``None`` when
    a sampled token is outside the kept alternatives); ``logtoku`` carries the raw top-K logits either way.
    """

    top_logprobs: list[TopLogprob] = Field(default_factory=list)
    logtoku: LogTokUToken | None = None


class ChatLogprobs(BaseModel):
    """``logprobs`` of a chat choice: the answer's tokens in ``content``, a refusal's in ``refusal`` (OpenAI's
    two lists). A withheld answer has ``{"content": [], "refusal": []}``: no token of its draft, and no
    log-probability of the guard's message, which the model did not generate."""

    model_config = _RESPONSE
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(BaseModel):
    """The legacy ``logprobs`` object of a completion choice (values as in :class:`ChatTokenLogprob`)."""

    model_config = _RESPONSE
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float | None] | None] = Field(default_factory=list)
    logtoku: list[LogTokUToken] | None = None


class Usage(BaseModel):
    model_config = _RESPONSE
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class AssistantMessage(BaseModel):
    """The answer: ``content`` (null when the answer is only tool calls, or withheld) and ``tool_calls``;
    ``refusal``: the guard's message when it withheld the answer (OpenAI's refusal channel; ``content`` is then null)."""

    model_config = _RESPONSE
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[tw.ToolCall] = Field(default_factory=list)


class DeltaMessage(BaseModel):
    """What a chat chunk adds to the message (fields left out of the JSON when not sent)."""

    model_config = _RESPONSE
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[tw.ToolCallDelta] | None = None


class _Choice(BaseModel):
    model_config = _RESPONSE
    index: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logtoku: SummaryPayload | None = Field(default=None, description="LogTokU scores of the answer (this server only).")
    logtoku_guard: ServedDecisionPayload | None = Field(
        default=None, description="The guard's decision (this server, under a policy); never the withheld draft."
    )


class ChatChoice(_Choice):
    logtoku: tw.ChoiceScoresPayload | None = Field(
        default=None, description="LogTokU scores of the answer and of each tool call's arguments (this server only)."
    )
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None


class ChatChunkChoice(_Choice):
    logtoku: tw.ChoiceScoresPayload | None = Field(
        default=None, description="In the last chunk: the answer's and each tool call's scores (this server only)."
    )
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None


class CompletionChoice(_Choice):
    text: str
    logprobs: CompletionLogprobs | None = None


class _Envelope(BaseModel):
    """What every response and stream event carries around its choices (the field order of OpenAI's JSON:
    each subclass narrows ``object`` and ``choices`` in place)."""

    model_config = _RESPONSE
    id: str
    object: str
    created: int
    model: str
    choices: list[Any]
    usage: Usage | None = None


class ChatCompletionResponse(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice] = Field(min_length=1)


class ChatCompletionChunk(_Envelope):
    """One server-sent event of a chat stream (the last one, ``choices`` empty, may carry ``usage``)."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class CompletionResponse(_Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice] = Field(min_length=1)


class CompletionChunk(_Envelope):
    """One server-sent event of a completion stream (same ``object`` as the whole response, as vLLM)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ModelCard(BaseModel):
    model_config = _RESPONSE
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    model_config = _RESPONSE
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ReviewVerdict(BaseModel):
    """``GET /v1/logtoku/reviews/{id}``: a served answer sent to human review, and its verdict.

    ``answer`` is the answer the review released: the reviewer's edit, else the model's answer,
    once ``approved``; ``null`` while ``pending``/``claimed`` and once ``rejected`` (then ``note``
    says why). The withheld draft is never sent before a reviewer approves it.
    """

    model_config = _RESPONSE
    object: Literal["logtoku.review"] = "logtoku.review"
    id: int
    trace_id: str
    status: Literal["pending", "claimed", "approved", "rejected"]
    decided: bool
    answer: str | None = None
    edited: bool = False
    reviewer: str | None = None
    note: str | None = None
    decided_at: str | None = None


class ErrorInfo(BaseModel):
    """OpenAI's error: ``code`` is a string or null, as OpenAI's (this server writes one of
    :data:`logtoku_guard.server.wire.ERROR_CODES`; other servers' integer codes are still read); a guard
    refusal (422) adds ``logtoku_guard``."""

    model_config = _RESPONSE
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None
    logtoku_guard: ServedDecisionPayload | None = None


class ErrorResponse(BaseModel):
    model_config = _RESPONSE
    error: ErrorInfo


# -- validation errors as one sentence ---------------------------------------------------------
def describe_errors(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """``(message, param)`` for a request's validation errors (pydantic's or FastAPI's ``errors()``),
    naming the first failing field, its value and what is accepted (:mod:`logtoku_guard.wire.openai_errors`)."""
    models = (ChatCompletionRequest, CompletionRequest, ChatMessageParam, TextPart, StreamOptions, *_TOOL_MODELS)
    return _describe(errors, models, (ChatCompletionRequest, CompletionRequest))


_TOOL_MODELS = (
    tw.ToolParam,
    tw.FunctionDefinition,
    tw.NamedToolChoice,
    tw.NamedFunction,
    tw.JsonSchemaSpec,
    tw.ResponseFormat,
    tw.ToolCall,
    tw.FunctionCall,
)
