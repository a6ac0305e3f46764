"""Backends: where raw top-K logits come from.

``base`` (the :class:`Backend` protocol, :class:`TokenStream`), ``fake`` (``ScriptedBackend``),
``transformers`` (``TransformersBackend``) and its parts: ``recorder`` (raw top-K capture,
token scoring, stop strings), ``detokenizer``, ``processors`` (the logits processors of the
model's generation config, ``DynamicTemperatureLogitsWarper``), ``loading`` (local folder,
.gguf, cached hub id, embedded default), ``hf_compat`` (the KV cache argument across
transformers 5.x) and ``quiet`` (transformers' output silenced around our calls);
``openai_compat`` (``OpenAICompatibleBackend``: a remote server's raw top-K logits);
``llamacpp`` (``LlamaCppBackend``: GGUF models run by llama.cpp, the ``llamacpp`` extra) and its
parts ``llamacpp_model`` (the C API: model, context, vocabulary, chat template) and
``llamacpp_loop`` (continuous batching over llama.cpp sequences).
"""

from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.base import Backend, TokenStream

if TYPE_CHECKING:
    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend

__all__ = ["Backend", "LlamaCppBackend", "OpenAICompatibleBackend", "TokenStream"]


def __getattr__(name: str) -> Any:
    if name == "OpenAICompatibleBackend":  # lazy: httpx is imported only when it is used
        from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend

        return OpenAICompatibleBackend
    if name == "LlamaCppBackend":  # lazy: llama_cpp is imported only when one is constructed
        from logtoku_guard.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend
    msg = f"module 'logtoku_guard.backends' has no attribute {name!r}"
    raise AttributeError(msg)
