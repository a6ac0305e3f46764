"""logtoku_guard: single-pass decoupled token uncertainty (LogTokU) for local LLMs.

Data flow: prompt -> generation with raw top-K logits (a backend) -> token AU/EU
(:mod:`logtoku_guard.uncertainty`) -> response reliability -> policy decision.

``import logtoku_guard`` is light: torch and transformers load only when a backend or a
tensor function is used, and no LLM framework (LangChain, LlamaIndex) is ever imported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from logtoku_guard.errors import (
    ConfigurationError,
    InvalidPromptError,
    LogTokUError,
    MissingDependencyError,
    ModelLoadError,
    NonFiniteLogitsError,
    PromptTooLongError,
)
from logtoku_guard.types import (
    ChatMessage,
    DecodingOptions,
    DynamicTemperature,
    Generation,
    ResponseScore,
    Timings,
    TokenScore,
)
from logtoku_guard.uncertainty import (
    Quadrant,
    QuadrantThresholds,
    WordScore,
    log_softmax_stats,
    logtoku,
    rescore,
    response_reliability,
    token_uncertainty,
    top_k_logits,
    top_n_mean,
    word_scores,
)

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend, TokenStream
    from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
    from logtoku_guard.backends.transformers import TransformersBackend
    from logtoku_guard.embedded import EMBEDDED_MODEL, ensure_embedded_model

__version__ = "0.1.0"

_LAZY = {
    "Backend": "logtoku_guard.backends.base",
    "TokenStream": "logtoku_guard.backends.base",
    "ScriptedAnswer": "logtoku_guard.backends.fake",
    "ScriptedBackend": "logtoku_guard.backends.fake",
    "TransformersBackend": "logtoku_guard.backends.transformers",
    "EMBEDDED_MODEL": "logtoku_guard.embedded",
    "ensure_embedded_model": "logtoku_guard.embedded",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module 'logtoku_guard' has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "EMBEDDED_MODEL",
    "Backend",
    "ChatMessage",
    "ConfigurationError",
    "DecodingOptions",
    "DynamicTemperature",
    "Generation",
    "InvalidPromptError",
    "LogTokUError",
    "MissingDependencyError",
    "ModelLoadError",
    "NonFiniteLogitsError",
    "PromptTooLongError",
    "Quadrant",
    "QuadrantThresholds",
    "ResponseScore",
    "ScriptedAnswer",
    "ScriptedBackend",
    "Timings",
    "TokenScore",
    "TokenStream",
    "TransformersBackend",
    "WordScore",
    "__version__",
    "ensure_embedded_model",
    "log_softmax_stats",
    "logtoku",
    "rescore",
    "response_reliability",
    "token_uncertainty",
    "top_k_logits",
    "top_n_mean",
    "word_scores",
]
