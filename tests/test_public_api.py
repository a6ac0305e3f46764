"""The public surface of ``logtoku_guard``: exact ``__all__``, every name resolves, light import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import logtoku_guard

EXPECTED_ALL = [
    "EMBEDDED_MODEL",
    "AuditRecord",
    "AuditStore",
    "AuditStoreError",
    "Backend",
    "ChatMessage",
    "ConfigurationError",
    "Decision",
    "DecodingOptions",
    "DynamicTemperature",
    "Generation",
    "Guard",
    "GuardRejectedError",
    "GuardResult",
    "InvalidPromptError",
    "KeywordRetriever",
    "LogTokUError",
    "MissingDependencyError",
    "ModelLoadError",
    "ModelProfile",
    "NonFiniteLogitsError",
    "Policy",
    "PromptTooLongError",
    "Quadrant",
    "QuadrantThresholds",
    "ResponseScore",
    "ResponseStats",
    "ReviewError",
    "ReviewItem",
    "ReviewStateError",
    "ScriptedAnswer",
    "ScriptedBackend",
    "Timings",
    "TokenScore",
    "TokenStream",
    "TransformersBackend",
    "UnknownReviewItemError",
    "UnknownTraceError",
    "WordScore",
    "__version__",
    "calibrate",
    "default_policy",
    "ensure_embedded_model",
    "fit_threshold",
    "load_profile_for",
    "log_softmax_stats",
    "logtoku",
    "rescore",
    "response_reliability",
    "token_uncertainty",
    "top_k_logits",
    "top_n_mean",
    "word_scores",
]

HEAVY = ("torch", "transformers", "langchain_core", "llama_index")


def test_all_is_exactly_the_expected_list() -> None:
    assert list(logtoku_guard.__all__) == EXPECTED_ALL
    assert len(set(EXPECTED_ALL)) == len(EXPECTED_ALL)
    assert sorted(EXPECTED_ALL, key=lambda n: (not n.isupper(), not n[:1].isupper(), n)) == EXPECTED_ALL


@pytest.mark.parametrize("name", EXPECTED_ALL)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(logtoku_guard, name) is not None


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = logtoku_guard.no_such_thing  # type: ignore[attr-defined]


def test_errors_hierarchy_is_exported() -> None:
    g = logtoku_guard
    assert issubclass(g.ConfigurationError, g.LogTokUError) and issubclass(g.ConfigurationError, ValueError)
    assert issubclass(g.PromptTooLongError, g.InvalidPromptError)
    assert issubclass(g.InvalidPromptError, g.ConfigurationError)
    assert issubclass(g.MissingDependencyError, ImportError)
    assert issubclass(g.NonFiniteLogitsError, ArithmeticError)
    assert isinstance(g.__version__, str) and g.__version__


def test_import_is_light() -> None:
    code = f"import logtoku_guard, sys; heavy = [m for m in {HEAVY!r} if m in sys.modules]; print('HEAVY=' + ','.join(heavy))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "HEAVY=", f"import logtoku_guard loaded: {proc.stdout.strip()[6:]}"


def test_light_import_check_can_fail() -> None:
    """The subprocess probe really sees a heavy import (guards against a vacuous check)."""
    code = (
        "import logtoku_guard, sys; logtoku_guard.logtoku(__import__('torch').tensor([1.0, 2.0])); print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
