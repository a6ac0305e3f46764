"""What the server runs for a request: generation (and, with a policy, the guard) off the event loop.

:class:`Runner` is the seam: ``await runner.run(fn)`` calls ``fn(backend)`` in a worker thread
and returns its result. :class:`ThreadRunner` runs up to ``workers`` such calls at once on the
shared backend (by default twice the backend's ``max_batch``); a
:class:`~logtoku_guard.backends.transformers.TransformersBackend` runs the calls in one
continuous batch (:mod:`logtoku_guard.backends.batching`): a request joins the running batch at
the next decoding step and each returns as soon as its own answer ends. Everything above it
(guard, streaming, wire format) stays as it is.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from logtoku_guard.backends.base import Backend, TokenStream
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, TokenScore

T = TypeVar("T")


class Runner(Protocol):
    """Runs ``fn(backend)`` off the event loop; the one thing a batcher replaces."""

    backend: Backend

    async def run(self, fn: Callable[[Backend], T]) -> T: ...

    def slot(self) -> Any:
        """An async context manager held for the life of a stream (one generation)."""
        ...


class ThreadRunner:
    """At most ``workers`` generations at once, each in a worker thread (requests queue in order).

    ``workers`` defaults to twice the backend's ``max_batch`` (1 for a backend without one):
    up to ``max_batch`` generate in the running batch while the others wait in the backend's queue.
    """

    def __init__(self, backend: Backend, workers: int | None = None) -> None:
        import anyio

        if workers is None:
            workers = 2 * int(getattr(backend, "max_batch", 0)) or 1
        self.backend = backend
        self._limiter = anyio.CapacityLimiter(workers)

    async def run(self, fn: Callable[[Backend], T]) -> T:
        import anyio.to_thread

        async with self._limiter:
            return await anyio.to_thread.run_sync(fn, self.backend)

    def slot(self) -> Any:
        return self._limiter


@dataclass(frozen=True)
class Answer:
    """A finished request: the generation, the text the client gets, the guard's result if any."""

    generation: Generation
    text: str
    guard_result: Any = None


class Engine:
    """Generation and guarding for the server's requests.

    Args:
        runner: where generations run (:class:`ThreadRunner` over the backend).
        policy: a :class:`~logtoku_guard.policy.Policy`; when given, every answer is guarded
            and returned with the decision.
        profile, store: passed to the :class:`~logtoku_guard.guard.Guard` (quantile
            thresholds, audit/human review).
    """

    def __init__(self, runner: Runner, *, policy: Any = None, profile: Any = None, store: Any = None) -> None:
        self.runner = runner
        self.policy = policy
        self.profile = profile
        self.store = store
        if policy is not None:
            self._guard(DecodingOptions())  # validate policy/profile/store at start-up, not per request

    @property
    def backend(self) -> Backend:
        return self.runner.backend

    def _guard(self, options: DecodingOptions, backend: Backend | None = None) -> Any:
        from logtoku_guard.guard import Guard

        return Guard(backend or self.backend, self.policy, profile=self.profile, store=self.store, options=options)

    async def answer(self, messages: list[ChatMessage], options: DecodingOptions) -> Answer:
        """Generate (and guard) one answer; raises the guard's ``GuardRejectedError`` for ``raise``."""
        if self.policy is None:
            g = await self.runner.run(lambda b: b.generate(messages, options))
            return Answer(g, g.text)
        result = await self.runner.run(lambda b: self._guard(options, b).run(messages))
        return Answer(result.generation, result.answer, result)

    async def stream(self, messages: list[ChatMessage], options: DecodingOptions) -> AsyncIterator[TokenScore | Answer]:
        """Yield each token as it is generated, then the :class:`Answer`.

        With a policy, the answer is decided before anything is sent (an answer the guard
        withholds must never reach the client): its tokens then follow at once. Closing the
        iterator early (client gone) cancels the generation.
        """
        import anyio.to_thread

        if self.policy is not None:
            answer = await self.answer(messages, options)
            for t in answer.generation.tokens:
                yield t
            yield answer
            return
        async with self.runner.slot():
            stream: TokenStream = await anyio.to_thread.run_sync(lambda: self.backend.stream(messages, options))
            done = False
            try:
                it = iter(stream)
                while True:
                    token: TokenScore | None = await anyio.to_thread.run_sync(next, it, None)
                    if token is None:
                        break
                    yield token
                done = True
            finally:
                if not done:
                    # cancelled (client disconnected) or failed: stop generating, without blocking the loop
                    closer = threading.Thread(target=_close_quietly, args=(stream,), name="logtoku-stream-close", daemon=True)
                    closer.start()
            g = await anyio.to_thread.run_sync(lambda: stream.generation)
        yield Answer(g, g.text)


def _close_quietly(stream: TokenStream) -> None:
    import logging

    try:
        stream.close()
    except Exception:  # the generation's own error was already raised to the request (or the client left)
        logging.getLogger(__name__).debug("error while closing an abandoned stream", exc_info=True)
