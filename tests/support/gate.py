"""Deterministic batches without timing: hold the backend's worker inside a forward pass.

- :class:`Gate`: a forward pre-hook on the model; while :meth:`Gate.held` is open the worker
  waits inside its next forward pass, so requests submitted meanwhile stay queued, and on
  release they all join the running batch at the same step boundary.
- :class:`CallGate`: the same on any method (llama.cpp's ``decode``).
- :class:`Forwards`: records the shape of every forward pass (rows, new tokens, mask width,
  rows in the KV cache), to see rows join and leave.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class Gate:
    """Holds the model's next forward pass until released (see :meth:`held`); with ``thread``, only a
    pass made by the thread of that name (a long prompt's concurrent prefill: the loop goes on)."""

    def __init__(self, model: Any, thread: str | None = None) -> None:
        self._open = threading.Event()
        self._open.set()
        self.paused = threading.Event()
        self.thread = thread
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: Any) -> None:
        if self.thread is not None and threading.current_thread().name != self.thread:
            return
        if not self._open.is_set():
            self.paused.set()
            self._open.wait(60)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Inside: the worker (which must be generating) waits in a forward pass; released on exit."""
        self.paused.clear()
        self._open.clear()
        try:
            if not self.paused.wait(30):
                msg = "the worker never reached the model: is a generation running?"
                raise AssertionError(msg)
            yield
        finally:
            self._open.set()


class CallGate(Gate):
    """A :class:`Gate` on a method of any object (``llama.cpp``'s ``decode``): held, the worker waits in its next call."""

    def __init__(self, owner: Any, name: str, thread: str | None = None) -> None:
        self._open = threading.Event()
        self._open.set()
        self.paused = threading.Event()
        self.thread = thread
        real = getattr(owner, name)

        def gated(*args: Any, **kwargs: Any) -> Any:
            self._hook(owner, args)
            return real(*args, **kwargs)

        setattr(owner, name, gated)


@dataclass(frozen=True)
class Forward:
    rows: int  # rows in the input ids
    new: int  # new tokens per row (1: a decoding step; more: a prefill)
    width: int  # attention mask columns
    cached_rows: int | None  # rows in the KV cache given (None: none, a prefill)


class Forwards:
    """Every forward pass of ``model``, in order."""

    def __init__(self, model: Any) -> None:
        self.seen: list[Forward] = []
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        cache = kwargs["cache"] if "cache" in kwargs else kwargs.get("past_key_values")  # the name before transformers 5.24
        cached = int(cache.layers[0].keys.shape[0]) if cache is not None else None
        self.seen.append(Forward(int(ids.shape[0]), int(ids.shape[1]), int(mask.shape[1]), cached))
