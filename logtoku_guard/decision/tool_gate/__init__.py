"""Uncertainty-gated tool calls: per-argument scores -> the ``tool_calls`` policy section -> an
action before the tool runs (run, human review, re-ask, refuse).

Framework-free: :mod:`~logtoku_guard.decision.tool_gate.scores` parses the scores a model writes beside
its tool calls, :mod:`~logtoku_guard.decision.tool_gate.call_policy` decides on one call, and
:mod:`~logtoku_guard.decision.tool_gate.call_review` builds the audit record of a gated call and reads a
reviewer's verdict back. The LangChain agent middleware applies them
(``langchain_logtoku.LogTokUMiddleware``).
"""

from __future__ import annotations

from logtoku_guard.decision.tool_gate.call_conditions import ArgumentCheck, ArgumentCompare
from logtoku_guard.decision.tool_gate.call_policy import ToolAction, ToolCallPolicy, ToolDecision, ToolRule
from logtoku_guard.decision.tool_gate.scores import ARGUMENT_STATS, ArgumentScore, ScoredToolCall, parse_tool_call_scores

__all__ = [
    "ARGUMENT_STATS",
    "ArgumentCheck",
    "ArgumentCompare",
    "ArgumentScore",
    "ScoredToolCall",
    "ToolAction",
    "ToolCallPolicy",
    "ToolDecision",
    "ToolRule",
    "parse_tool_call_scores",
]
