"""LangChain integration of logtoku_guard: a chat model whose tokens carry LogTokU AU/EU, and a guard.

- :class:`ChatLogTokU`: a ``BaseChatModel`` over a core backend (the embedded
  SmolLM2-135M-Instruct by default); scores in ``response_metadata["logtoku"]``.
- :class:`LogTokUGuard`: a ``Runnable`` applying a core :class:`~logtoku_guard.decision.policy.Policy`
  (pass, warn, retrieve, abstain, human review, raise) to the chat model's answers.
- :class:`LogTokUMiddleware`: the same guard as LangChain v1 agent middleware for
  ``create_agent`` (routes every model call; :class:`ReviewRequest` / :class:`ReviewResponse`
  are the human-review interrupt's payload and resume value).
- :class:`FlaggedAnswerHandler`: a callback handler collecting (and optionally storing) the
  answers the guard flagged.
- :func:`human_review_node`: a LangGraph node that ``interrupt()``s for a human verdict
  (needs ``langgraph``).

The distribution ``langchain-logtoku`` (``integrations/langchain`` in the logtoku-guard checkout:
``pip install ./integrations/langchain``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_logtoku.callbacks import FLAGGED_EVENT, RETRACTED_EVENT, FlaggedAnswer, FlaggedAnswerHandler
from langchain_logtoku.chat_models import ChatLogTokU
from langchain_logtoku.guard import LogTokUGuard
from langchain_logtoku.middleware import LogTokUMiddleware, ReviewRequest, ReviewResponse

if TYPE_CHECKING:
    from langchain_logtoku.graph import ReviewVerdict, human_review_node


def __getattr__(name: str) -> Any:
    if name in ("human_review_node", "ReviewVerdict"):  # langgraph is optional: imported on use
        from langchain_logtoku import graph

        return getattr(graph, name)
    msg = f"module 'langchain_logtoku' has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "FLAGGED_EVENT",
    "RETRACTED_EVENT",
    "ChatLogTokU",
    "FlaggedAnswer",
    "FlaggedAnswerHandler",
    "LogTokUGuard",
    "LogTokUMiddleware",
    "ReviewRequest",
    "ReviewResponse",
    "ReviewVerdict",
    "human_review_node",
]
