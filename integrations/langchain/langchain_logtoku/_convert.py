"""Conversions between LangChain objects and the core's typed objects (no maths here).

- LangChain messages <-> core :class:`~logtoku_guard.types.ChatMessage` turns;
- a core :class:`~logtoku_guard.types.Generation` -> the JSON-ready ``response_metadata`` of a
  chat message: ``"logtoku"`` (per-token items and the response summary) and, when asked,
  OpenAI-format ``"logprobs"``.

Every value written into metadata is JSON-ready: non-finite floats become ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage
from langchain_core.messages.ai import UsageMetadata

from logtoku_guard.errors import InvalidPromptError
from logtoku_guard.types import ChatMessage as CoreMessage
from logtoku_guard.types import Generation, TokenScore
from logtoku_guard.uncertainty import Quadrant, QuadrantThresholds

_ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "ai": "assistant"}


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
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            msg = f"message {i} holds a {kind!r} content block; ChatLogTokU reads text only: send text blocks (or a plain string)"
            raise InvalidPromptError(msg)
    return "".join(parts)


def to_core_messages(messages: Sequence[BaseMessage]) -> list[CoreMessage]:
    """LangChain messages -> core chat turns (system / human / ai; ``name`` is dropped).

    Raises :class:`~logtoku_guard.errors.InvalidPromptError` for tool messages, tool calls and
    non-text content, which the model cannot read.
    """
    out: list[CoreMessage] = []
    for i, m in enumerate(messages):
        if isinstance(m, SystemMessage):
            role = "system"
        elif isinstance(m, HumanMessage):
            role = "user"
        elif isinstance(m, AIMessage):
            if m.tool_calls:
                msg = f"message {i} is an AI message with tool calls; ChatLogTokU does not support tool calling"
                raise InvalidPromptError(msg)
            role = "assistant"
        elif isinstance(m, ChatMessage) and m.role in _ROLES:
            role = _ROLES[m.role]
        else:
            msg = (
                f"message {i} is a {type(m).__name__} (type {m.type!r}); ChatLogTokU takes system, human and ai "
                "messages only (no tool or function messages: the model cannot call tools)"
            )
            raise InvalidPromptError(msg)
        out.append(CoreMessage(role, _text_of(m, i)))  # type: ignore[arg-type]
    return out


def to_langchain_messages(messages: Sequence[CoreMessage]) -> list[BaseMessage]:
    """Core chat turns -> LangChain messages."""
    kinds: dict[str, type[BaseMessage]] = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    return [kinds[m.role](content=m.content) for m in messages]


def json_float(x: float) -> float | None:
    """``x`` as a float, or ``None`` when it is NaN or infinite (JSON has neither)."""
    return float(x) if math.isfinite(x) else None


def token_item(token: TokenScore, thresholds: QuadrantThresholds | None) -> dict[str, Any]:
    """One token's scores: ``{token, id, au, eu, quadrant, logprob}`` (AU/EU higher = more uncertain).

    ``quadrant`` is ``None`` without thresholds (no calibration profile) or when AU/EU is
    undefined (raw evidence mode).
    """
    quadrant = None
    if thresholds is not None and math.isfinite(token.au) and math.isfinite(token.eu):
        quadrant = thresholds.classify(token.au, token.eu).value
    return {
        "token": token.text,
        "id": token.id,
        "au": json_float(token.au),
        "eu": json_float(token.eu),
        "quadrant": quadrant,
        "logprob": json_float(token.logprob),
    }


def summary(generation: Generation, thresholds: QuadrantThresholds | None) -> dict[str, Any]:
    """The response summary (scalars; higher reliability = more reliable).

    ``quadrant_shares``: share of the tokens in each quadrant (``None`` without thresholds);
    ``thresholds``: the AU/EU thresholds used and where they came from.
    """
    shares: dict[str, float] | None = None
    tokens = generation.tokens
    if thresholds is not None and tokens:
        labels = [thresholds.classify(t.au, t.eu) for t in tokens if math.isfinite(t.au) and math.isfinite(t.eu)]
        n = len(labels)
        shares = {q.value: (sum(lab is q for lab in labels) / n if n else 0.0) for q in Quadrant}
    score = generation.score
    return {
        "reliability": json_float(score.reliability),
        "reliability_mean": json_float(score.reliability_mean),
        "quadrant_shares": shares,
        "k": generation.k,
        "evidence": generation.evidence,
        "top_n": generation.top_n,
        "n_tokens": len(tokens),
        "thresholds": None if thresholds is None else {"au": thresholds.au, "eu": thresholds.eu, "source": thresholds.source},
    }


def logprob_item(token: TokenScore, top_logprobs: int, decode: Callable[[int], str]) -> dict[str, Any]:
    """One token in the OpenAI ``logprobs.content`` format.

    ``top_logprobs`` come from the stored top-K **raw logits**: every log-probability shares
    the normaliser ``logsumexp(z)`` over the vocabulary, and the chosen token gives it away,
    ``logsumexp(z) = z_chosen - logprob_chosen``, so ``logprob_j = z_j - z_chosen +
    logprob_chosen``. This needs the chosen token among the K stored ids (always true for
    greedy decoding); when a sampled token falls outside them the normaliser is unknown and
    ``top_logprobs`` is empty for that token. ``bytes`` are the UTF-8 bytes of the decoded
    text (an incomplete multi-byte character has empty text and no bytes).
    """
    tops: list[dict[str, Any]] = []
    if top_logprobs > 0 and token.id in token.top_ids:
        chosen = token.top_ids.index(token.id)
        lse = token.top_logits[chosen] - token.logprob
        for tid, z in list(zip(token.top_ids, token.top_logits))[:top_logprobs]:
            text = token.text if tid == token.id else decode(tid)
            tops.append({"token": text, "logprob": z - lse, "bytes": list(text.encode("utf-8"))})
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
