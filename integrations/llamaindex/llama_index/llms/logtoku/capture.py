"""The side channel that carries scored generations past ``llm.predict()``.

LlamaIndex query and chat engines call ``llm.predict()`` / ``llm.stream()``, which return
plain strings: the ``additional_kwargs`` of the LLM's responses never reach the engine's
``Response``. :class:`~llama_index.llms.logtoku.LogTokULLM` therefore also hands every
finished :class:`~logtoku_guard.types.Generation` to the captures that were active (in the
calling context) when the call was *made*::

    with capture_generations() as captured:
        answer = query_engine.query("Who founded the Zarnovian Institute?")
    captured.last.score.reliability, captured.last.tokens

The capture is taken when ``chat``/``stream_chat``/... is called, not when a stream is
consumed, so a stream created inside the ``with`` block and read after it still reports to it.
Captures nest: every active capture receives the generation.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

from logtoku_guard.types import Generation, TokenScore

T = TypeVar("T")

_ACTIVE: ContextVar[tuple[GenerationCapture, ...]] = ContextVar("logtoku_captures", default=())


@dataclass
class GenerationCapture:
    """Generations made while this capture was active, in the order they finished.

    ``live_tokens``: the tokens of the generation being streamed now (cleared when a new
    generation starts), each with its AU/EU as soon as the backend produced it.
    ``cancel_stream()`` stops the generation being streamed (its ``finish_reason`` becomes
    ``"cancelled"``); the stream then ends normally with what was generated.
    """

    generations: list[Generation] = field(default_factory=list)
    live_tokens: list[TokenScore] = field(default_factory=list)
    _cancel: Callable[[], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def last(self) -> Generation | None:
        """The most recent finished generation (None when there is none yet)."""
        with self._lock:
            return self.generations[-1] if self.generations else None

    def cancel_stream(self) -> bool:
        """Stop the generation that is streaming now; False when none is."""
        with self._lock:
            cancel = self._cancel
        if cancel is None:
            return False
        cancel()
        return True

    # -- called by the LLM ----------------------------------------------------------------
    def _started(self, cancel: Callable[[], None] | None) -> None:
        with self._lock:
            self.live_tokens = []
            self._cancel = cancel

    def _token(self, token: TokenScore) -> None:
        with self._lock:
            self.live_tokens.append(token)

    def _finished(self, generation: Generation) -> None:
        with self._lock:
            self.generations.append(generation)
            self._cancel = None


@contextmanager
def capture_generations(capture: GenerationCapture | None = None) -> Iterator[GenerationCapture]:
    """Collect every generation a :class:`LogTokULLM` makes inside the ``with`` block.

    Pass an existing ``capture`` to make it active again (e.g. while a lazy stream is read).
    """
    capture = capture if capture is not None else GenerationCapture()
    token = _ACTIVE.set((*_ACTIVE.get(), capture))
    try:
        yield capture
    finally:
        _ACTIVE.reset(token)


def captured_iter(items: Iterator[T], capture: GenerationCapture) -> Generator[T, None, None]:
    """Iterate ``items`` with ``capture`` active during each step, never across a ``yield``.

    LlamaIndex synthesisers create their LLM stream lazily, on the first ``next()``: this
    makes that call (made wherever the stream is read) report to ``capture``.
    """
    try:
        while True:
            with capture_generations(capture):
                try:
                    item = next(items)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()  # a reader that stops early stops the generation too


async def captured_aiter(items: AsyncIterator[T], capture: GenerationCapture) -> AsyncGenerator[T, None]:
    """:func:`captured_iter` for async iterators."""
    try:
        while True:
            with capture_generations(capture):
                try:
                    item = await items.__anext__()
                except StopAsyncIteration:
                    return
            yield item
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


def active_captures() -> tuple[GenerationCapture, ...]:
    """The captures active in the current context (read when an LLM call is made)."""
    return _ACTIVE.get()
