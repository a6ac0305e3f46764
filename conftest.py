"""Shared fixtures of every test folder (the core's ``tests/`` and each integration package's
``integrations/*/tests/``): the tiny random model of :mod:`support.tiny` and the real embedded model.

``tests/`` (with ``support/``) and ``integrations/llamaindex/tests`` (``li_support``) are on
``sys.path`` through ``pythonpath`` in pyproject.toml. Nothing is downloaded for the fast tests:
``tiny_tokenizer``/``tiny_backend`` are built by ``tests/support/tiny.py`` (import its helpers
from there: ``from support.tiny import make_model``). ``embedded_cache``/``embedded_backend`` serve the ``slow`` tests.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from support.tiny import make_model, make_tokenizer

# A user's machine has nothing beside the checkout: the tests must pass without the workspace's
# shared/ folder (datasets, notes). The evaluation datasets are found only through
# $LOGTOKU_GUARD_DATA or --data-dir, so the variable is dropped for the whole run (subprocesses
# included), and any attempt to open a file under ../shared fails loudly instead of passing here
# and failing on a user's clone. `.ci/run` also hides the folder itself while the suite runs.
os.environ.pop("LOGTOKU_GUARD_DATA", None)
SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared") + os.sep


def _refuse_shared(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and args and isinstance(args[0], str | bytes) and os.path.abspath(os.fsdecode(args[0])).startswith(SHARED):
        msg = f"a test opened {os.fsdecode(args[0])!r}: tests must not read ../shared; ship the data in the package or a fixture"
        raise PermissionError(msg)


sys.addaudithook(_refuse_shared)

# Bytecode caches are written for the test run even where PYTHONDONTWRITEBYTECODE is set (this
# project's VM sets it). Without them every pytest process, and every xdist worker, compiles the
# project's modules and rewrites the asserts of every test module again: 15-17 s of each worker's
# 30 s collection (`pytest --collect-only -m "not slow"`: 30.8 s without caches, 13.2 s with them).
# They go to the checkout's __pycache__ folders (git-ignored), written atomically by importlib and
# pytest; Python reads existing caches whatever the variable says, so later runs and the suite's
# subprocesses use them. Set LOGTOKU_TESTS_NO_BYTECODE=1 to keep the variable's meaning.
if not os.environ.get("LOGTOKU_TESTS_NO_BYTECODE"):
    sys.dont_write_bytecode = False


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
