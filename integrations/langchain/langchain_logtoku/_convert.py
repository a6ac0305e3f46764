"""Conversions between LangChain objects and the core's typed objects (no maths here).

- LangChain messages <-> core :class:`~logtoku_guard.types.ChatMessage` turns (tool calls and
  tool results rendered as text by :mod:`langchain_logtoku.tools`);
- OpenAI-format ``"logprobs"`` items and usage from a core :class:`~logtoku_guard.types.Generation`;
- :class:`GuardPayload`, the type of the guard's ``response_metadata["logtoku_guard"]``.

The scores themselves (``response_metadata["logtoku"]``: per-token items and the response
summary) are the core payloads, :func:`logtoku_guard.wire.payloads.token_payload` and
:func:`logtoku_guard.wire.payloads.summary_payload`; every value is JSON-ready (non-finite floats
become ``None``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.runnables import Runnable

from langchain_logtoku.tools import render_tool_calls, render_tool_result
from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError, InvalidPromptError
from logtoku_guard.guard.retriever_calls import RetrieverLike
from logtoku_guard.tools.tool_calls import add_tool_result
from logtoku_guard.types import ChatMessage as CoreMessage
from logtoku_guard.types import Generation, TokenScore
from logtoku_guard.wire.payloads import ResultPayload

LangChainRetriever = Runnable[Any, Any] | RetrieverLike
"""What the guard and the middleware retrieve with: a LangChain retriever or any Runnable from the
query to passages (Documents or strings), an object with ``.retrieve(query)``, or a callable."""

_ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "ai": "assistant"}


_CALL_BLOCKS = frozenset({"tool_use", "tool_call", "function_call"})
"""Content blocks of an AI message that describe a tool call (Anthropic, LangChain v1, OpenAI formats)."""

CALL_ARGS = frozenset(
    {"temperature", "max_tokens", "top_p", "seed", "top_k", "logprobs", "top_logprobs", "model", "stream"}
    | {"tools", "tool_choice", "parallel_tool_calls", "ls_structured_output_format", "response_format"}
)
"""The per-call keywords ``ChatLogTokU`` accepts (besides ``stop``)."""
LEGACY_TOOL_ARGS = frozenset({"functions", "function_call"})
"""OpenAI's legacy function-calling keywords, refused with a pointer to ``bind_tools``."""


def _text_of(message: BaseMessage, i: int) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(message, AIMessage) and isinstance(block, dict) and block.get("type") in _CALL_BLOCKS:
            continue  # the call itself is in message.tool_calls, rendered as a <tool_call> block
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            msg = f"message {i} holds a {kind!r} content block; ChatLogTokU reads text only: send text blocks (or a plain string)"
            raise InvalidPromptError(msg)
    return "".join(parts)


def to_core_messages(messages: Sequence[BaseMessage]) -> list[CoreMessage]:
    """LangChain messages -> core chat turns (system / human / ai / tool; ``name`` is dropped).

    An AI message with tool calls becomes an assistant turn with ``<tool_call>`` blocks; tool
    messages become a user turn of ``<tool_response>`` blocks (consecutive ones share the turn;
    :mod:`langchain_logtoku.tools`). Raises :class:`~logtoku_guard.errors.InvalidPromptError`
    for function messages and non-text content, which the model cannot read.
    """
    out: list[CoreMessage] = []
    for i, m in enumerate(messages):
        if isinstance(m, ToolMessage):
            add_tool_result(out, render_tool_result(m))
            continue
        if isinstance(m, SystemMessage):
            role = "system"
        elif isinstance(m, HumanMessage):
            role = "user"
        elif isinstance(m, AIMessage):
            if m.tool_calls:
                _text_of(m, i)  # text content only
                out.append(CoreMessage("assistant", render_tool_calls(m)))
                continue
            role = "assistant"
        elif isinstance(m, ChatMessage) and m.role in _ROLES:
            role = _ROLES[m.role]
        else:
            msg = (
                f"message {i} is a {type(m).__name__} (type {m.type!r}); ChatLogTokU takes system, human, ai "
                "and tool messages (no legacy function messages)"
            )
            raise InvalidPromptError(msg)
        out.append(CoreMessage(role, _text_of(m, i)))  # type: ignore[arg-type]
    return out


def to_langchain_messages(messages: Sequence[CoreMessage]) -> list[BaseMessage]:
    """Core chat turns -> LangChain messages."""
    kinds: dict[str, type[BaseMessage]] = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    return [kinds[m.role](content=m.content) for m in messages]


class _GuardRequired(ResultPayload):
    question: str
    passages: int
    recorded: bool


class GuardPayload(_GuardRequired, total=False):
    """``response_metadata["logtoku_guard"]`` of a :class:`~langchain_logtoku.LogTokUGuard` answer.

    The core :class:`~logtoku_guard.wire.payloads.ResultPayload` (action, route, rule, reason,
    reliability, attempts, review_id, trace_id, checks, stats, stopped_early, policy
    ``{name, version}``, model, answer, draft, tokens, timings) plus: ``question`` (the
    retrieval query), ``passages`` (how many the final attempt was given), ``recorded`` (the
    guard wrote it to its audit store) and, in ``stream_mode="retract"``, ``retracted``.
    """

    retracted: bool


def logprob_item(token: TokenScore, top_logprobs: int, decode: Callable[[int], str]) -> dict[str, Any]:
    """One token in the OpenAI ``logprobs.content`` format.

    ``top_logprobs`` come from the stored **raw logits** (the backend's ``max_logprobs`` of them,
    ``token.alt_logits``, else the top K): every log-probability shares
    the normaliser ``logsumexp(z)`` over the vocabulary, and the chosen token gives it away,
    ``logsumexp(z) = z_chosen - logprob_chosen``, so ``logprob_j = z_j - z_chosen +
    logprob_chosen``. This needs the chosen token among the K stored ids (always true for
    greedy decoding); when a sampled token falls outside them the normaliser is unknown and
    ``top_logprobs`` is empty for that token. ``bytes`` are the UTF-8 bytes of the decoded
    text (an incomplete multi-byte character has empty text and no bytes).
    """
    tops: list[dict[str, Any]] = []
    for tid, logprob in token.top_logprobs(top_logprobs):  # TokenScore.top_logprobs: the maths
        text = token.text if tid == token.id else decode(tid)
        tops.append({"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))})
    return {
        "token": token.text,
        "logprob": token.logprob,
        "bytes": list(token.text.encode("utf-8")),
        "top_logprobs": tops,
    }


def usage(generation: Generation) -> UsageMetadata:
    """Prompt tokens in, scored answer tokens out (the end-of-sequence token is not counted)."""
    n_in, n_out = int(generation.prompt_tokens), len(generation.tokens)
    return UsageMetadata(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out)


def check_top_logprobs(n: Any, k: int, capacity: int) -> int:
    """``n`` validated as a ``top_logprobs`` request against the raw logits kept per token."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        msg = f"top_logprobs must be a non-negative integer, got {n!r}"
        raise ConfigurationError(msg)
    if n > capacity:
        msg = (
            f"top_logprobs={n} but only max_logprobs={capacity} raw logits are kept per token "
            f"(K={k}, top_k, is what LogTokU scores and is unaffected): build the model with "
            f"ChatLogTokU(max_logprobs={n}) or TransformersBackend(max_logprobs={n})"
        )
        raise ConfigurationError(msg)
    return n


def decoder(backend: Backend) -> Callable[[int], str]:
    """Token id -> its text, from the backend's tokenizer (``<id N>`` without one)."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return lambda i: f"<id {i}>"
    return lambda i: str(tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False))
