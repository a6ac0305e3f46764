"""Backends the server tests run on both kinds of: the tiny random transformers model and the embedded GGUF under llama.cpp."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from support.postgres import in_ci


def tiny_served(tiny_tokenizer: Any, *, max_positions: int = 1024, max_batch: int = 4, **kwargs: Any) -> Any:
    """The tiny random model as a TransformersBackend with room for ``max_positions`` tokens."""
    from logtoku_guard.backends.transformers import TransformersBackend
    from support.tiny import make_model

    model = make_model(tiny_tokenizer, max_positions=max_positions)
    return TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, max_batch=max_batch, **kwargs)


def llamacpp_served(*, n_ctx: int = 2048, max_batch: int = 4, **kwargs: Any) -> Any:
    """The embedded GGUF under llama.cpp (1 thread); skipped without llama-cpp-python, failed under CI."""
    if importlib.util.find_spec("llama_cpp") is None:
        if in_ci():
            pytest.fail("llama-cpp-python is not installed: scripts/install.sh --dev must install it under CI")
        pytest.skip("llama-cpp-python is not installed")
    from logtoku_guard.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend("embedded", n_threads=1, n_ctx=n_ctx, max_batch=max_batch, **kwargs)
