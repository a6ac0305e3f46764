"""``GuardStream``: a guarded answer token by token, recorded even when the caller stops early.

Returned by :meth:`~logtoku_guard.guard.guard.Guard.stream`: the one driver
(:meth:`~logtoku_guard.guard.driver.Driver.drive_live`, ``live="first"``) with
:class:`~logtoku_guard.guard.guard_io.BackendIO`. Iterating streams the first answer's tokens while the
driver watches the policy's ``early_stop`` rules; when the stream ends that answer is decided,
retrieved for and recorded. Closed or dropped before its end (``close()``, a ``with`` block,
``break`` then garbage collection), the backend stream is cancelled and what was generated is
recorded (:meth:`~logtoku_guard.guard.guard_steps.Progress.abandon`). Recording happens when the token
generator is finalized; should the store fail then, Python reports the exception through
``sys.unraisablehook`` (it cannot propagate from a finalizer).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from logtoku_guard.decision.results import GuardRejectedError, GuardResult
from logtoku_guard.errors import UsageError
from logtoku_guard.guard.driver import raise_for_action
from logtoku_guard.guard.guard_io import BackendIO
from logtoku_guard.guard.telemetry import Guarded
from logtoku_guard.types import ChatMessage, TokenScore, question_of

if TYPE_CHECKING:
    from collections.abc import Sequence

    from logtoku_guard.guard.driver import Driver
    from logtoku_guard.guard.retriever_calls import RetrieverLike
    from logtoku_guard.guard.telemetry import GuardTelemetry, RunSpan
    from logtoku_guard.types import DecodingOptions

__all__ = ["GuardStream", "StreamingGuard"]


class StreamingGuard(Guarded, Protocol):
    """What a stream drives (:class:`~logtoku_guard.guard.guard.GuardCall` has it): the backend, options
    and retriever, the telemetry and the driver of a question."""

    @property
    def telemetry(self) -> GuardTelemetry: ...

    @property
    def options(self) -> DecodingOptions: ...

    @property
    def retriever(self) -> RetrieverLike | None: ...

    def driver(self, span: RunSpan | None = None, span_input: Sequence[ChatMessage] | str | None = None) -> Driver: ...


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
    """What a guarded stream's generator hands back: the result (concluded, or abandoned)."""

    result: GuardResult | None = None


def _run(guard: StreamingGuard, messages: list[ChatMessage], state: _State) -> Iterator[TokenScore]:
    span = guard.telemetry.start_run(guard, messages)  # ended here, or by the driver when abandoned
    driver = guard.driver(span, messages)
    try:
        state.result = yield from driver.drive_live(question_of(messages), BackendIO.of(guard, messages), live="first")
    except GeneratorExit:
        state.result = driver.result  # abandoned: decided and recorded (None when nothing was generated)
        raise
    except BaseException as exc:
        span.fail(exc)
        span.end()
        raise
    try:
        raise_for_action(state.result)
    except GuardRejectedError as exc:
        span.fail(exc)
        raise
    finally:
        span.end()
