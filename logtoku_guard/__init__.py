"""logtoku_guard: single-pass decoupled token uncertainty (LogTokU) for local LLMs.

Data flow: prompt -> generation with raw top-K logits (a backend) -> token AU/EU
(:mod:`logtoku_guard.scoring.uncertainty`) -> response reliability -> policy decision -> guard action
(:mod:`logtoku_guard.guard.guard`) -> JSON payloads (:mod:`logtoku_guard.wire.payloads`) and audit record.
Framework adapters hand generations to guards through :mod:`logtoku_guard.guard.generation_capture`.

``import logtoku_guard`` is light: torch and transformers load only when a backend or a
tensor function is used, and no LLM framework (LangChain, LlamaIndex) is ever imported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from logtoku_guard.errors import (
    AuditStoreError,
    BackendError,
    ConfigurationError,
    DatasetUnavailableError,
    GrammarError,
    InvalidPromptError,
    LogProbsNotLogitsError,
    LogTokUError,
    MissingDependencyError,
    ModelLoadError,
    NonFiniteLogitsError,
    PolicyError,
    PromptTooLongError,
    RemoteServerError,
    ReviewError,
    ReviewStateError,
    ReviewTimeoutError,
    UnknownReviewItemError,
    UnknownTraceError,
    UnreadableRowError,
    UsageError,
)
from logtoku_guard.scoring.quadrants import Quadrant, QuadrantThresholds
from logtoku_guard.scoring.uncertainty import logtoku, rescore
from logtoku_guard.tools.constraints import JsonSchema, ToolCalls
from logtoku_guard.types import (
    ChatMessage,
    DecodingOptions,
    DynamicTemperature,
    Generation,
    ResponseScore,
    TokenScore,
)

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditRecord, AuditStore, ReviewItem
    from logtoku_guard.backends.base import Backend, TokenStream
    from logtoku_guard.backends.embedded import EMBEDDED_MODEL, ensure_embedded_model
    from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
    from logtoku_guard.backends.transformers import TransformersBackend
    from logtoku_guard.calibration import ModelProfile, calibrate, fit_threshold, load_profile_for
    from logtoku_guard.decision.decider import Decider
    from logtoku_guard.decision.policy import Decision, Policy, default_policy
    from logtoku_guard.decision.results import GuardRejectedError, GuardResult
    from logtoku_guard.guard.generation_capture import GenerationCapture, capture_generations
    from logtoku_guard.guard.guard import Guard
    from logtoku_guard.guard.keyword_retriever import KeywordRetriever
    from logtoku_guard.scoring.stats import ResponseStats

__version__ = "0.1.0"

_LAZY = {
    "Backend": "logtoku_guard.backends.base",
    "TokenStream": "logtoku_guard.backends.base",
    "ScriptedAnswer": "logtoku_guard.backends.fake",
    "ScriptedBackend": "logtoku_guard.backends.fake",
    "TransformersBackend": "logtoku_guard.backends.transformers",
    "EMBEDDED_MODEL": "logtoku_guard.backends.embedded",
    "AuditRecord": "logtoku_guard.audit",
    "AuditStore": "logtoku_guard.audit",
    "ReviewItem": "logtoku_guard.audit",
    "Decision": "logtoku_guard.decision.policy",
    "Policy": "logtoku_guard.decision.policy",
    "default_policy": "logtoku_guard.decision.policy",
    "ResponseStats": "logtoku_guard.scoring.stats",
    "ModelProfile": "logtoku_guard.calibration",
    "calibrate": "logtoku_guard.calibration",
    "fit_threshold": "logtoku_guard.calibration",
    "load_profile_for": "logtoku_guard.calibration",
    "Decider": "logtoku_guard.decision.decider",
    "Guard": "logtoku_guard.guard.guard",
    "GuardResult": "logtoku_guard.decision.results",
    "GuardRejectedError": "logtoku_guard.decision.results",
    "GenerationCapture": "logtoku_guard.guard.generation_capture",
    "capture_generations": "logtoku_guard.guard.generation_capture",
    "KeywordRetriever": "logtoku_guard.guard.keyword_retriever",
    "ensure_embedded_model": "logtoku_guard.backends.embedded",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module 'logtoku_guard' has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "EMBEDDED_MODEL",
    "AuditRecord",
    "AuditStore",
    "AuditStoreError",
    "Backend",
    "BackendError",
    "ChatMessage",
    "ConfigurationError",
    "DatasetUnavailableError",
    "Decider",
    "Decision",
    "DecodingOptions",
    "DynamicTemperature",
    "Generation",
    "GenerationCapture",
    "GrammarError",
    "Guard",
    "GuardRejectedError",
    "GuardResult",
    "InvalidPromptError",
    "JsonSchema",
    "KeywordRetriever",
    "LogProbsNotLogitsError",
    "LogTokUError",
    "MissingDependencyError",
    "ModelLoadError",
    "ModelProfile",
    "NonFiniteLogitsError",
    "Policy",
    "PolicyError",
    "PromptTooLongError",
    "Quadrant",
    "QuadrantThresholds",
    "RemoteServerError",
    "ResponseScore",
    "ResponseStats",
    "ReviewError",
    "ReviewItem",
    "ReviewStateError",
    "ReviewTimeoutError",
    "ScriptedAnswer",
    "ScriptedBackend",
    "TokenScore",
    "TokenStream",
    "ToolCalls",
    "TransformersBackend",
    "UnknownReviewItemError",
    "UnknownTraceError",
    "UnreadableRowError",
    "UsageError",
    "__version__",
    "calibrate",
    "capture_generations",
    "default_policy",
    "ensure_embedded_model",
    "fit_threshold",
    "load_profile_for",
    "logtoku",
    "rescore",
]
