"""Core generations rebuilt from a chat model's ``response_metadata["logtoku"]``.

:class:`~langchain_logtoku.LogTokUMiddleware` scores the agent's own model calls: from the
core capture channel when the model is :class:`~langchain_logtoku.ChatLogTokU`, else from the
LogTokU metadata any chat model may write (each token's raw ``top_logits``), re-scored here
with the core maths (:func:`~logtoku_guard.scoring.uncertainty.rescore`).
"""

from __future__ import annotations

import math
from typing import Any, cast

from langchain_core.messages import AIMessage

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.uncertainty import EvidenceMode, rescore
from logtoku_guard.types import Generation, TokenScore

__all__ = ["generation_from_metadata"]


def generation_from_metadata(message: AIMessage) -> Generation:
    """Rebuild the core generation of an answer from its ``response_metadata["logtoku"]``.

    AU/EU are recomputed from each token's stored ``top_logits`` with
    :func:`~logtoku_guard.scoring.uncertainty.rescore` (K and evidence mode from the summary).
    Raises :class:`~logtoku_guard.errors.ConfigurationError` when the metadata is missing.
    """
    found = message.response_metadata.get("logtoku")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    tokens = meta.get("tokens")
    if not isinstance(tokens, list) or any(not isinstance(t, dict) or "top_logits" not in t for t in tokens):
        msg = (
            "LogTokUMiddleware needs token scores, but the model's answer has no response_metadata['logtoku']['tokens'] "
            "with raw 'top_logits': use ChatLogTokU, or a chat model that writes LogTokU metadata "
            f"(got response_metadata keys {sorted(message.response_metadata)})"
        )
        raise ConfigurationError(msg)
    k, evidence = int(meta.get("k", 2)), cast(EvidenceMode, meta.get("evidence", "clamped"))
    rows = [[math.nan if z is None else float(z) for z in t["top_logits"]] for t in tokens]
    scored = rescore(rows, k=k, evidence=evidence) if rows else None
    out = []
    for i, t in enumerate(tokens):
        au = float(scored.au[i]) if scored is not None else math.nan
        eu = float(scored.eu[i]) if scored is not None else math.nan
        lp, ent = t.get("logprob"), t.get("entropy")
        out.append(
            TokenScore(
                index=int(t.get("index", i)),
                id=int(t.get("id", -1)),
                text=str(t.get("token", "")),
                top_logits=tuple(rows[i]),
                top_ids=(),
                au=au,
                eu=eu,
                logprob=math.nan if lp is None else float(lp),
                entropy=math.nan if ent is None else float(ent),
            )
        )
    finish = meta.get("finish_reason")
    return Generation(
        model=str(meta.get("model") or message.response_metadata.get("model_name") or "unknown"),
        prompt="",
        text=message.text,
        tokens=tuple(out),
        finish_reason=finish if finish in ("stop", "length", "cancelled") else "stop",
        k=k,
        evidence=evidence,
        top_n=int(meta.get("top_n", 10)),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
    )
