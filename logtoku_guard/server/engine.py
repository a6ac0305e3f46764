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

import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from logtoku_guard.backends.base import Backend, TokenStream
from logtoku_guard.errors import ConfigurationError, UsageError
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, TokenScore

if TYPE_CHECKING:
    from logtoku_guard.audit.records import RecordSink
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.guard.guard import Guard

T = TypeVar("T")


class Runner(Protocol):
    """Runs ``fn(backend)`` off the event loop; the one thing a batcher replaces."""

    backend: Backend

    async def run(self, fn: Callable[[Backend], T]) -> T: ...

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the runner's threads (a step of a streamed generation, inside its :meth:`slot`)."""
        ...

    def slot(self) -> Any:
        """An async context manager held for the life of a stream (one generation).

        It must not care which task leaves it: a stream abandoned by its client is closed by
        whichever task finalizes it, and the slot is released exactly once on every path.
        """
        ...


class ThreadRunner:
    """At most ``workers`` generations at once, each in a worker thread (requests queue in order).

    ``workers`` defaults to twice the backend's ``max_batch`` (1 for a backend without one):
    up to ``max_batch`` generate in the running batch while the others wait in the backend's queue.

    The slots are a semaphore, not an :class:`anyio.CapacityLimiter`: a limiter's token belongs to
    the task that borrowed it, and a stream whose client hung up may be closed by another task
    (the event loop finalizing the abandoned generator), which a limiter refuses, losing the slot.

    The threads are the runner's own: every call runs under a :class:`anyio.CapacityLimiter` of
    ``workers`` tokens, never AnyIO's default 40-token limiter, which everything else in the
    process shares (FastAPI's sync routes, the gate's policy checks, other libraries): whatever
    fills that one, generation still gets a thread as soon as it holds a slot.
    """

    def __init__(self, backend: Backend, workers: int | None = None) -> None:
        import anyio

        if workers is None:
            workers = 2 * int(getattr(backend, "max_batch", 0)) or 1
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            msg = f"workers must be a whole number >= 1, got {workers!r}"
            raise ConfigurationError(msg)
        self.backend = backend
        self.workers = workers
        self._slots = anyio.Semaphore(workers)
        self._threads = anyio.CapacityLimiter(workers)

    @property
    def busy(self) -> int:
        """Slots held now (generations running or streaming), ``0`` to ``workers``."""
        return self.workers - self._slots.value

    async def run(self, fn: Callable[[Backend], T]) -> T:
        """``fn(backend)`` in a worker thread. Cancelling the caller (a client gone) abandons the thread
        at once: ``fn`` must then stop by itself (the engine's calls watch a cancel event)."""
        import anyio.to_thread

        async with self.slot():
            return await anyio.to_thread.run_sync(fn, self.backend, abandon_on_cancel=True, limiter=self._threads)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the runner's threads (a step of a streamed generation, inside its :meth:`slot`)."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(fn, *args, limiter=self._threads)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot; released exactly once on leaving, whichever task leaves."""
        await self._slots.acquire()
        try:
            yield
        finally:
            self._slots.release()


class ClientGone(Exception):
    """The request's client went away: its generation was stopped (nothing is sent)."""


class CancellableBackend:
    """``backend`` whose :meth:`generate` streams and stops at the next decoding step once ``cancel`` is set.

    The server's calls go through it, so a client that goes away frees its row (guarded or not):
    a generation already running ends ``"cancelled"``; one asked for after that (a guard's retry)
    raises :class:`ClientGone` before it starts. Everything else is the backend's own.
    """

    def __init__(self, backend: Backend, cancel: threading.Event) -> None:
        self._backend = backend
        self._cancel = cancel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def generate(self, prompt: Any, options: DecodingOptions | None = None, **kwargs: Any) -> Generation:
        stream = self.stream(prompt, options, **kwargs)
        with stream:
            for _ in stream:
                pass
        return stream.generation

    def stream(self, prompt: Any, options: DecodingOptions | None = None, **kwargs: Any) -> TokenStream:
        """The backend's stream, ending after the token at which ``cancel`` is found set (the guard's
        ``early_stop`` watch streams through here too)."""
        if self._cancel.is_set():
            raise ClientGone
        inner = self._backend.stream(prompt, options, **kwargs)

        def tokens() -> Iterator[TokenScore]:
            for token in inner:
                yield token
                if self._cancel.is_set():
                    inner.close()
                    return

        return TokenStream(tokens(), lambda: inner.generation, inner.close)


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
        policy: a :class:`~logtoku_guard.decision.policy.Policy`; when given, every answer is guarded
            and returned with the decision.
        profile, store, cache_dir: passed to the :class:`~logtoku_guard.guard.guard.Guard` (quantile
            thresholds, ``"auto"``: the model's saved or shipped profile; audit and human review).

    The guard is built once, here. What the server needs of the settings beyond the guard's own
    checks (a store for tool calls sent to review) is checked once, by
    :class:`~logtoku_guard.server.settings.ServerSettings`, when the app is built.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        policy: Policy | None = None,
        profile: ModelProfile | Literal["auto"] | None = None,
        store: RecordSink | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.runner = runner
        self.policy = policy
        self.store = store
        self.guard: Guard | None = None
        """The guard, built and checked once at start-up (policy, profile, store, decider, telemetry);
        each request runs it with its own backend (watching the client) and options."""
        if policy is not None:
            from logtoku_guard.decision.decider import require_review_store
            from logtoku_guard.guard.guard import Guard
            from logtoku_guard.server.settings import REVIEW_QUEUE_NEEDED

            # the Guard's Decider checks the answers' rules; the served tool-call rules are the engine's
            require_review_store(policy, store, answers=False, tool_calls=True, needs=REVIEW_QUEUE_NEEDED)
            self.guard = Guard(self.backend, policy, profile=profile, store=store, cache_dir=cache_dir)
        self.profile: ModelProfile | None = self.guard.profile if self.guard is not None else None

    @property
    def backend(self) -> Backend:
        return self.runner.backend

    async def answer(
        self, messages: list[ChatMessage], options: DecodingOptions, cancel: threading.Event | None = None
    ) -> Answer:
        """Generate (and guard) one answer; raises the guard's ``GuardRejectedError`` for ``raise``.

        ``cancel`` set (the client went away), or this call cancelled, stops the generation at its next
        decoding step (:class:`CancellableBackend`)."""
        stop = cancel if cancel is not None else threading.Event()
        try:
            guard = self.guard
            if guard is None:
                g = await self.runner.run(lambda b: CancellableBackend(b, stop).generate(messages, options))
                return Answer(g, g.text)
            result = await self.runner.run(lambda b: guard.run(messages, backend=CancellableBackend(b, stop), options=options))
        except BaseException:
            stop.set()  # cancelled (client gone) or failed: the worker thread stops at its next step
            raise
        return Answer(result.generation, result.answer, result)

    async def stream(self, messages: list[ChatMessage], options: DecodingOptions) -> AsyncGenerator[TokenScore | Answer, None]:
        """Yield each token as it is generated, then the :class:`Answer` (unguarded: with a policy,
        nothing may be sent before the guard decides, so the server calls :meth:`answer`).

        Closing the iterator early (client gone) cancels the generation and frees its runner slot:
        close it with ``aclose()`` (:func:`contextlib.aclosing`) in the task that iterates it; one
        that is merely dropped frees the slot when the event loop finalizes it, from another task.
        """
        if self.policy is not None:
            msg = "a guarded answer is decided before it is sent: call Engine.answer, not Engine.stream"
            raise UsageError(msg)
        async with self.runner.slot():
            stream: TokenStream = await self.runner.call(lambda: self.backend.stream(messages, options))
            done = False
            try:
                it = iter(stream)
                while True:
                    token: TokenScore | None = await self.runner.call(next, it, None)
                    if token is None:
                        break
                    yield token
                done = True
            finally:
                if not done:
                    # cancelled (client disconnected) or failed: stop generating, without blocking the loop
                    closer = threading.Thread(target=_close_quietly, args=(stream,), name="logtoku-stream-close", daemon=True)
                    closer.start()
            g = await self.runner.call(lambda: stream.generation)
        yield Answer(g, g.text)


def _close_quietly(stream: TokenStream) -> None:
    import logging

    try:
        stream.close()
    except Exception:  # the generation's own error was already raised to the request (or the client left)
        logging.getLogger(__name__).debug("error while closing an abandoned stream", exc_info=True)


DISCONNECT_POLL_S = 0.1
"""Pause between two reads of a request's connection that brought something other than its disconnect."""


async def while_connected(request: Any, work: Callable[[threading.Event], Awaitable[T]]) -> T:
    """``await work(cancel)`` while watching the client: when it goes away, ``cancel`` is set (the
    generation stops at its next step) and :class:`ClientGone` is raised. Exceptions of ``work`` pass as they are."""
    import anyio

    cancel = threading.Event()
    outcome: list[Any] = []

    async def run(scope: Any) -> None:
        try:
            outcome.append(("ok", await work(cancel)))
        except Exception as exc:
            outcome.append(("error", exc))
        scope.cancel()

    async def watch(scope: Any) -> None:
        # The body has been read: the connection's next message is the client's disconnect.
        while (await request.receive()).get("type") != "http.disconnect":
            await anyio.sleep(DISCONNECT_POLL_S)
        cancel.set()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        await run(tg.cancel_scope)
    if not outcome:
        raise ClientGone
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value
