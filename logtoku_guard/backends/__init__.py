"""Backends: where raw top-K logits come from."""

from logtoku_guard.backends.base import Backend, TokenStream

__all__ = ["Backend", "TokenStream"]
