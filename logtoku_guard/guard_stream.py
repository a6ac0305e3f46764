"""``GuardStream``: a guarded answer token by token, recorded even when the caller stops early.

Returned by :meth:`~logtoku_guard.guard.Guard.stream`. Iterating streams the first attempt's
tokens while watching the policy's ``early_stop`` rules; when the stream ends the guard
decides, retrieves and records (:meth:`~logtoku_guard.guard.Guard.finish`). Closed or dropped
before its end (``close()``, a ``with`` block, ``break`` then garbage collection), the backend
stream is cancelled and what was generated is recorded (:meth:`~logtoku_guard.guard.Guard.abandon`).
Recording happens when the token generator is finalized; should the store fail then, Python
reports the exception through ``sys.unraisablehook`` (it cannot propagate from a finalizer).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from logtoku_guard.errors import UsageError
from logtoku_guard.telemetry import Guarded
from logtoku_guard.types import ChatMessage, TokenScore

if TYPE_CHECKING:
    from logtoku_guard.policy import Decision
    from logtoku_guard.results import Attempt, GuardResult
    from logtoku_guard.telemetry import GuardTelemetry, RunSpan
    from logtoku_guard.types import DecodingOptions, Generation

__all__ = ["GuardStream", "StreamingGuard"]


class StreamingGuard(Guarded, Protocol):
    """What a stream drives (:class:`~logtoku_guard.guard.Guard` has it): generate with the
    guard's backend and options, watch the early-stop rule, then finish or abandon."""

    @property
    def telemetry(self) -> GuardTelemetry: ...

    @property
    def options(self) -> DecodingOptions: ...

    def early_stop(self, tokens: Sequence[TokenScore]) -> Decision | None: ...

    def finish(
        self,
        messages: Sequence[ChatMessage],
        generation: Generation,
        *,
        stopped_early: bool = False,
        started: float | None = None,
        generation_s: float = 0.0,
        span: RunSpan | None = None,
    ) -> GuardResult: ...

    def abandon(
        self,
        messages: Sequence[ChatMessage],
        generation: Generation,
        *,
        started: float,
        generation_s: float,
        attempts: Sequence[Attempt] = (),
    ) -> GuardResult: ...


class GuardStream:
    """Iterate for tokens (each with its scores); ``.result`` once the stream has ended.

    Close it (``close()``, a ``with`` block, or just drop it) to stop early: generation is
    cancelled and what was generated is still decided and recorded, with ``finish_reason``
    ``"cancelled"`` and a reason starting "stream closed by the caller" (no retrieval is made).
    A stream never iterated generated nothing and records nothing.
    """

    def __init__(self, guard: StreamingGuard, messages: list[ChatMessage]) -> None:
        self.guard = guard
        self.messages = messages
        self._state = _State()
        self._tokens: Iterator[TokenScore] | None = None

    def __iter__(self) -> Iterator[TokenScore]:
        # The token generator holds no reference to self (no cycle): once neither this object nor
        # the caller's loop holds it, CPython finalizes it at once, which records the abandoned answer.
        if self._tokens is None:
            self._tokens = _run(self.guard, self.messages, self._state)
        return self._tokens

    def __enter__(self) -> GuardStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop generating; a stream closed before its end records what it generated."""
        if self._tokens is not None:
            self._tokens.close()  # type: ignore[attr-defined]

    @property
    def result(self) -> GuardResult:
        if self._state.result is None:
            msg = "the guarded stream is not finished: iterate it to the end before reading .result"
            raise UsageError(msg)
        return self._state.result


class _State:
    """What a guarded stream's generator hands back: the result, whether it stopped early."""

    result: GuardResult | None = None
    stopped_early: bool = False


def _run(guard: StreamingGuard, messages: list[ChatMessage], state: _State) -> Iterator[TokenScore]:
    start = time.perf_counter()
    seen: list[TokenScore] = []
    abandoned = False
    span = guard.telemetry.start_run(guard, messages)  # ended by guard.finish, or below when abandoned
    generating = span.generation(1, messages)
    with guard.backend.stream(messages, guard.options) as stream:
        for token in stream:
            seen.append(token)
            try:
                yield token
            except GeneratorExit:
                abandoned = True
                break
            if guard.early_stop(seen) is not None:
                state.stopped_early = True
                break
    generation = stream.generation
    generating.end_with(generation)
    elapsed = time.perf_counter() - start
    if abandoned:
        state.result = guard.abandon(messages, generation, started=start, generation_s=elapsed)
        span.end(state.result)
        return
    state.result = guard.finish(
        messages, generation, stopped_early=state.stopped_early, started=start, generation_s=elapsed, span=span
    )
