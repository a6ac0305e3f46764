"""Backends: where raw top-K logits come from.

``base`` (the :class:`Backend` protocol, :class:`TokenStream`), ``fake`` (``ScriptedBackend``),
``transformers`` (``TransformersBackend``) and its parts: ``recorder`` (raw top-K capture,
token scoring, stop strings), ``detokenizer``, ``processors`` (``DynamicTemperatureLogitsWarper``)
and ``loading`` (local folder, .gguf, cached hub id, embedded default).
"""

from logtoku_guard.backends.base import Backend, TokenStream

__all__ = ["Backend", "TokenStream"]
