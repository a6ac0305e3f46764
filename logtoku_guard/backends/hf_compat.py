"""The transformers calls whose form changed within the supported range (transformers 5.x): the KV cache.

A model's forward takes and returns its :class:`~transformers.Cache`
 (a ``DynamicCache`` here) as ``past_key_values`` up to transformers 5.23 and as ``cache``
 from 5.24, where the old name still works but logs a deprecation and raises a
 ``FutureWarning`` on every forward (it goes in 5.40). :func:`cache_arg` names the argument
 the model takes; :func:`returned_cache` reads the cache back from its output under either
 name without touching the deprecated one.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

__all__ = ["cache_arg", "returned_cache"]


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
