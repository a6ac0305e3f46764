"""Prefix caching: the KV cache of a prompt's shared beginning, computed once and reused.

Every chat request starts with the same tokens: the chat template's opening and the system
prompt (25 of the 37 tokens of a short question for the embedded model). The decode loop
(:mod:`logtoku_guard.backends.decode_loop`) prefills that beginning once, keeps its keys and
values here, and from then on prefills only the rest of each prompt on top of them: a shorter
prefill for every request, and for a batch of joiners one prefill of their own tokens only.

What is cached: the keys and values of ``ids[:n]`` (``n``: :func:`prefix_length`, the tokens
before the question's own line), per layer, batch 1, keyed by those token ids exactly. The
keys are position-encoded (rotary) at positions ``0..n-1``, which every prompt that starts
with these tokens shares whatever its padding, so the entry is exact for any of them (float
differences of a different matrix-product shape, ~1e-6). Entries are evicted least recently
used first once their total size passes ``max_bytes``; an entry larger than that is not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.prompt_scoring import QuestionSpan

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_PREFIX_CACHE_MB", "PrefixCache", "prefix_length"]

DEFAULT_PREFIX_CACHE_MB = 64
"""The default bound of :class:`PrefixCache` in MiB (the embedded model: ~46 KB per token)."""

Layers = tuple[tuple["torch.Tensor", "torch.Tensor"], ...]


def prefix_length(span: QuestionSpan | None) -> int:
    """How many leading prompt tokens are cached as the prefix: those before the question's
    first token, less one (the position that predicts the question's first token stays in the
    prefilled part, where :mod:`~logtoku_guard.backends.prompt_scoring` reads its hidden
    state). 0 (nothing cached) without a question span or when the question starts the prompt."""
    if span is None or span.start < 2:
        return 0
    return span.start - 1


class PrefixCache:
    """Least-recently-used store of prompt-prefix KV caches, bounded in bytes (thread-safe).

    Args:
        max_bytes: most bytes of keys and values kept (0: nothing is kept).
    """

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            msg = f"max_bytes must be a whole number of bytes >= 0 (0 disables prefix caching), got {max_bytes!r}"
            raise ValueError(msg)
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[Layers, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held now."""
        with self._lock:
            return self._bytes

    def get(self, key: tuple[int, ...]) -> Layers | None:
        """The cached ``(keys, values)`` per layer of the prefix ``key`` (batch 1), or None (a miss)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: tuple[int, ...], layers: Layers) -> bool:
        """Keep ``layers`` for ``key`` (evicting the least recently used); False when too large to keep."""
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return False
            while self._entries and self._bytes + size > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
            self._entries[key] = (layers, size)
            self._bytes += size
            return True

    def clear(self) -> None:
        """Forget every entry (e.g. after the model's weights changed)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> dict[str, Any]:
        """``entries``, ``bytes``, ``hits`` and ``misses`` so far."""
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes, "hits": self.hits, "misses": self.misses}
