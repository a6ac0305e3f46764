"""``GuardStream``: a guarded answer token by token, recorded even when the caller stops early.

Returned by :meth:`~logtoku_guard.guard.Guard.stream`. Iterating streams the first attempt's
tokens while watching the policy's ``early_stop`` rules; when the stream ends the guard
decides, retrieves and records (:meth:`~logtoku_guard.guard.Guard.finish`). Closed or dropped
before its end (``close()``, a ``with`` block, ``break`` then garbage collection), the backend
stream is cancelled and what was generated is recorded (:meth:`~logtoku_guard.guard.Guard.abandon`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from logtoku_guard.errors import UsageError
from logtoku_guard.types import ChatMessage, TokenScore

if TYPE_CHECKING:
    from logtoku_guard.guard import Guard, GuardResult

__all__ = ["GuardStream"]

logger = logging.getLogger(__name__)


class GuardStream:
    """Iterate for tokens (each with its scores); ``.result`` once the stream has ended.

    Close it (``close()``, a ``with`` block, or just drop it) to stop early: generation is
    cancelled and what was generated is still decided and recorded, with ``finish_reason``
    ``"cancelled"`` and a reason starting "stream closed by the caller" (no retrieval is made).
    A stream never iterated generated nothing and records nothing.
    """

    def __init__(self, guard: Guard, messages: list[ChatMessage]) -> None:
        self.guard = guard
        self.messages = messages
        self._result: GuardResult | None = None
        self._stopped_early = False
        self._tokens: Iterator[TokenScore] | None = None

    def __iter__(self) -> Iterator[TokenScore]:
        if self._tokens is None:
            self._tokens = self._run()
        return self._tokens

    def __enter__(self) -> GuardStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop generating; a stream closed before its end records what it generated."""
        if self._tokens is not None:
            self._tokens.close()  # type: ignore[attr-defined]

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # cannot raise from a finalizer: logged, not swallowed silently
            logger.exception("recording an abandoned guarded stream failed")

    def _run(self) -> Iterator[TokenScore]:
        guard = self.guard
        start = time.perf_counter()
        seen: list[TokenScore] = []
        abandoned = False
        with guard.backend.stream(self.messages, guard.options) as stream:
            for token in stream:
                seen.append(token)
                try:
                    yield token
                except GeneratorExit:
                    abandoned = True
                    break
                if guard.early_stop(seen) is not None:
                    self._stopped_early = True
                    break
        generation = stream.generation
        elapsed = time.perf_counter() - start
        if abandoned:
            self._result = guard.abandon(self.messages, generation, started=start, generation_s=elapsed)
            return
        self._result = guard.finish(
            self.messages, generation, stopped_early=self._stopped_early, started=start, generation_s=elapsed
        )

    @property
    def result(self) -> GuardResult:
        if self._result is None:
            msg = "the guarded stream is not finished: iterate it to the end before reading .result"
            raise UsageError(msg)
        return self._result
