"""Shared fixtures: the tiny random model of :mod:`support.tiny` and the real embedded model.

Nothing is downloaded for the fast tests: ``tiny_tokenizer``/``tiny_backend`` are built by
``tests/support/tiny.py`` (import its helpers from there: ``from support.tiny import
make_model``). ``embedded_cache``/``embedded_backend`` serve the ``slow`` tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support.tiny import make_model, make_tokenizer

__all__ = ["make_model", "make_tokenizer"]  # still importable from conftest by older test modules


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    return make_tokenizer()


@pytest.fixture
def tiny_backend(tiny_tokenizer: Any) -> Any:
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend("tiny", model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer)


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cache folder for the real embedded model: $LOGTOKU_GUARD_CACHE when set, shared by slow tests."""
    env = os.environ.get("LOGTOKU_GUARD_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("ltg-cache")


@pytest.fixture(scope="session")
def embedded_backend(embedded_cache: Path) -> Any:
    pytest.importorskip("gguf")
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend(cache_dir=embedded_cache, device="cpu")
