"""The transformers calls whose form changed within the supported range (transformers 5.x).

- **The KV cache.** A model's forward takes and returns its :class:`~transformers.Cache`
  (a ``DynamicCache`` here) as ``past_key_values`` up to transformers 5.23 and as ``cache``
  from 5.24, where the old name still works but logs a deprecation and raises a
  ``FutureWarning`` on every forward (it goes in 5.40). :func:`cache_arg` names the argument
  the model takes; :func:`returned_cache` reads the cache back from its output under either
  name without touching the deprecated one.
- **The logits processors of** ``generate``. transformers has no public builder of the
  processors its ``generate`` derives from a ``GenerationConfig`` (repetition penalty,
  ``min_new_tokens``, temperature, top-p...), and rebuilding them here would drift from it:
  :func:`logits_processors` calls ``generate``'s own builder, the one private transformers
  API this package uses (same signature from 5.0 to 5.24), and fails with a clear message
  should a release remove it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import inspect
from typing import Any

from logtoku_guard.errors import ConfigurationError

__all__ = ["cache_arg", "logits_processors", "returned_cache"]


def cache_arg(module: Any) -> str:
    """The keyword under which ``module``'s forward takes its KV cache: ``"cache"`` or ``"past_key_values"``.

    Read from the forward's signature; a forward that takes only ``**kwargs`` (a subclass that
    passes them on) gets the name of the installed transformers.
    """
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return "cache" if _outputs_say_cache() else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache in a model's ``output`` (its ``cache`` field, ``past_key_values`` before transformers 5.24)."""
    return getattr(output, "cache" if _outputs_say_cache() else "past_key_values", None)


@functools.cache
def _outputs_say_cache() -> bool:
    """Whether this transformers names the cache ``cache`` in its model outputs (5.24 and later)."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    return "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)}


def logits_processors(model: Any, config: Any, **kwargs: Any) -> Any:
    """The ``LogitsProcessorList`` that ``model.generate`` builds from the generation ``config``.

    ``config`` is prepared in place as ``generate`` prepares it (its special tokens as tensors),
    so pass a copy. ``kwargs`` go to the builder (``input_ids_seq_length``, ``encoder_input_ids``,
    ``logits_processor``, ``device``).
    """
    prepare = getattr(model, "_prepare_special_tokens", None)
    build = getattr(model, "_get_logits_processor", None)
    if not (callable(prepare) and callable(build)):
        msg = (
            f"transformers {_version()} has no GenerationMixin._get_logits_processor / _prepare_special_tokens, "
            f"which this package uses to apply the model's generation config; install a transformers version "
            f"within the range this package declares (transformers>=5,<6), or pass a model that inherits GenerationMixin"
        )
        raise ConfigurationError(msg)
    prepare(config, True, kwargs.get("device"))
    return build(config, **kwargs)


def _version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"
