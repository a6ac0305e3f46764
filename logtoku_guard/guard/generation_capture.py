"""The side channel that hands core generations from a framework call to whoever asked for them.

LLM frameworks pass strings and JSON metadata between their layers: LangChain messages and
LlamaIndex ``llm.predict()`` results cannot carry the core
:class:`~logtoku_guard.types.Generation` (raw top-K logits included) that a guard needs. So
the framework adapter (``ChatLogTokU``, ``LogTokULLM``) reports every generation it makes to
the captures that were active, in the calling context, when the call was *made*::

    with capture_generations() as captured:
        answer = query_engine.query("Who founded the Zarnovian Institute?")
    captured.last.score.reliability, captured.last.tokens

Producer side (the adapters): read :func:`active_captures` when a call is made, then call
:meth:`GenerationCapture.started` (with the stream's cancel hook and, for a stream that may be
abandoned, a finalizer giving the generation so far), :meth:`~GenerationCapture.token` per
streamed token and :meth:`~GenerationCapture.finished` with the generation. Consumer side (the
guards): :attr:`~GenerationCapture.last` / :meth:`~GenerationCapture.take`,
:attr:`~GenerationCapture.live_tokens` and :meth:`~GenerationCapture.cancel_stream`.

Captures nest: every active capture receives the generation. The state lives in a
``contextvars.ContextVar``, so threads and asyncio tasks each see their own captures.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from logtoku_guard.types import Generation, TokenScore

if TYPE_CHECKING:
    from logtoku_guard.guard.driver import Watch

__all__ = ["GenerationCapture", "active_captures", "capture_generations", "captured_aiter", "captured_iter"]

T = TypeVar("T")

_ACTIVE: ContextVar[tuple[GenerationCapture, ...]] = ContextVar("logtoku_captures", default=())


@dataclass
class GenerationCapture:
    """Generations made while this capture was active, in the order they finished.

    ``live_tokens``: the tokens of the generation being streamed now (cleared when a new
    generation starts), each with its AU/EU as soon as the backend produced it.
    ``cancel_stream()`` stops the generation being streamed (its ``finish_reason`` becomes
    ``"cancelled"``); the stream then ends normally with what was generated. ``watch``: the
    driver's :class:`~logtoku_guard.guard.driver.Watch` of the generation this capture is made for;
    each token is reported to it, and the generation is stopped when it says so.
    """

    generations: list[Generation] = field(default_factory=list)
    live_tokens: list[TokenScore] = field(default_factory=list)
    _cancel: Callable[[], None] | None = field(default=None, repr=False)
    _finalizers: list[Callable[[], Generation]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    watch: Watch | None = None

    @property
    def last(self) -> Generation | None:
        """The most recent finished generation (None when there is none yet)."""
        with self._lock:
            return self.generations[-1] if self.generations else None

    def take(self) -> Generation | None:
        """The last finished generation, else the generation so far of the last stream started
        with a ``finalize`` hook (a stream its reader abandoned), else None."""
        with self._lock:
            if self.generations:
                return self.generations[-1]
            finalize = self._finalizers[-1] if self._finalizers else None
        return finalize() if finalize is not None else None

    def cancel_stream(self) -> bool:
        """Stop the generation that is streaming now; False when none is."""
        with self._lock:
            cancel = self._cancel
        if cancel is None:
            return False
        cancel()
        return True

    # -- called by the framework adapters (the producers) ----------------------------------
    def started(self, cancel: Callable[[], None] | None = None, finalize: Callable[[], Generation] | None = None) -> None:
        """A generation starts: ``cancel`` stops it early; ``finalize`` returns what it generated so far."""
        with self._lock:
            self.live_tokens = []
            self._cancel = cancel
            if finalize is not None:
                self._finalizers.append(finalize)

    def token(self, token: TokenScore) -> None:
        """One streamed token of the generation in progress (stopped here when the watch says so)."""
        with self._lock:
            self.live_tokens.append(token)
        if self.watch is not None and self.watch.token(token):
            self.cancel_stream()

    def finished(self, generation: Generation) -> None:
        """The generation in progress has ended (normally, cancelled or abandoned)."""
        with self._lock:
            self.generations.append(generation)
            self._cancel = None


@contextmanager
def capture_generations(capture: GenerationCapture | None = None) -> Iterator[GenerationCapture]:
    """Collect every generation an adapter makes inside the ``with`` block.

    Pass an existing ``capture`` to make it active again (e.g. while a lazy stream is read).
    """
    capture = capture if capture is not None else GenerationCapture()
    token = _ACTIVE.set((*_ACTIVE.get(), capture))
    try:
        yield capture
    finally:
        _ACTIVE.reset(token)


def active_captures() -> tuple[GenerationCapture, ...]:
    """The captures active in the current context (read when an LLM call is made)."""
    return _ACTIVE.get()


def captured_iter(items: Iterator[T], capture: GenerationCapture) -> Generator[T, None, None]:
    """Iterate ``items`` with ``capture`` active during each step, never across a ``yield``.

    Frameworks often create their LLM stream lazily, on the first ``next()``: this makes that
    call (made wherever the stream is read) report to ``capture``. Closing the returned
    generator closes ``items`` (a reader that stops early stops the generation too).
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
            close()


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
