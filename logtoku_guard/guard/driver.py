"""The one driver of the guard loop: every entry point hands it its question and its I/O, nothing more.

:func:`~logtoku_guard.guard.guard_steps.guard_steps` decides (written once, without I/O); this module
answers its requests, for every way of guarding: :class:`~logtoku_guard.guard.guard.Guard` (``run``,
``arun``, ``stream``; the server runs ``Guard.run``), LangChain's ``LogTokUGuard`` and
``LogTokUMiddleware``, LlamaIndex's ``LogTokUQueryEngine`` (every stream mode). The call's owner
builds a :class:`Driver` (what decides, the question's span, the top-N the watch reads:
:meth:`~logtoku_guard.guard.guard.GuardCall.driver`); an entry point hands it the question and a
:class:`GuardIO` (how it generates and retrieves; to stream its drafts, a :class:`LiveIO`): every
answer, the first included, is a ``Generate`` request of this driver. The driver owns the rest:

* **early stop**: every generation gets a :class:`Watch`, the one place ``early_stop`` rules are
  watched. The entry point reports each token to it as it is made (a core backend's stream:
  :class:`~logtoku_guard.guard.guard_io.BackendIO`; a framework model: a
  :class:`~logtoku_guard.guard.generation_capture.GenerationCapture` made with ``watch=``) and stops
  generating when :meth:`Watch.token` says so; the driver marks the answer ``stopped_early``.
* **the draft**: held by default (``live="held"``: nothing of an answer leaves before the guard
  decides); ``live="first"`` streams the first answer's pieces as they are made (a later answer
  is read whole), ``live="all"`` every answer's. A reader who closes a live stream stops the
  draft, which is decided and recorded as abandoned
  (:meth:`~logtoku_guard.guard.guard_steps.Progress.abandon`; no retrieval is spent).
* **second looks**: a :class:`~logtoku_guard.guard.guard_steps.Measure` (a policy rule reached a
  second-look statistic) is answered by the entry point's ``measure`` (:class:`MeasuringIO`; an
  entry point without one cannot run a policy that reads them: :class:`UsageError` before anything
  is generated, or, with a decider the first answer picks, before that answer is decided), in a
  ``second_look`` span.
* **records**: each generation, retrieval and second look in its child span of the question's
  :class:`~logtoku_guard.guard.telemetry.RunSpan` (when one is given), the result on that span.

Sync (:meth:`Driver.drive`, :meth:`Driver.drive_live`) and async (:meth:`Driver.adrive`,
:meth:`Driver.adrive_live`): what each request asks of the I/O, in which span, is written once
(``_Loop``); the two loops over it differ only by ``await`` (and ``async for`` over a live draft).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.results import GuardRejectedError
from logtoku_guard.errors import UsageError
from logtoku_guard.guard.guard_steps import (
    Answer,
    Conclude,
    DeciderFor,
    Generate,
    Measure,
    Measured,
    Progress,
    Request,
    Retrieve,
    Retrieved,
    guard_steps,
)
from logtoku_guard.guard.telemetry import GenerationSpan, RetrievalSpan, RunSpan, SecondLookSpan
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N

if TYPE_CHECKING:
    from logtoku_guard.decision.results import GuardResult
    from logtoku_guard.types import ChatMessage, Generation, TokenScore

__all__ = [
    "ABANDONED",
    "AsyncGuardIO",
    "AsyncLiveIO",
    "AsyncMeasuringIO",
    "DeciderFor",
    "Draft",
    "Driver",
    "GuardIO",
    "Live",
    "LiveIO",
    "MeasuringIO",
    "Watch",
    "adrive",
    "adrive_live",
    "drive",
    "drive_live",
    "raise_for_action",
]

P = TypeVar("P")
P_co = TypeVar("P_co", covariant=True)
Live = Literal["held", "first", "all"]
ABANDONED = "stream closed by the caller before the guard decided"
"""Why a live run ended without a decision: the reader closed it before any answer was generated."""


class Watch:
    """The ``early_stop`` watch of one generation: the one place those rules are watched.

    Made by the driver for each generation; whoever makes the tokens reports each to
    :meth:`token` and stops generating once it returns True. Thread-safe (a framework model may
    report from its own thread). Without ``decider``, or with a policy that has no
    ``early_stop`` rule, it only counts tokens.
    """

    def __init__(self, decider: Decider | None = None, top_n: int = DEFAULT_TOP_N) -> None:
        self._decider = decider if decider is not None and decider.watches_early_stop else None
        self._top_n = top_n
        self._tokens: list[TokenScore] = []
        self._lock = threading.Lock()
        self.stopped = False
        """True once an ``early_stop`` rule fired on this generation's prefix."""

    @property
    def watching(self) -> bool:
        """True when a rule may stop this generation (its tokens are worth reporting one by one)."""
        return self._decider is not None

    def token(self, token: TokenScore) -> bool:
        """Add the next token of the generation; True when it must stop now (a rule fired)."""
        with self._lock:
            self._tokens.append(token)
            if self.stopped or self._decider is None:
                return self.stopped
            self.stopped = self._decider.early_stop(self._tokens, self._top_n) is not None
            return self.stopped


class Draft(Protocol[P_co]):
    """An answer being generated, streamed to the reader: iterate for its pieces (tokens, text
    deltas); :meth:`close` stops generating (a reader gone); :meth:`answer` once iteration has
    ended or the draft was closed (the generation so far; None when nothing was generated)."""

    def __iter__(self) -> Iterator[P_co]: ...

    def close(self) -> None: ...

    def answer(self) -> Answer: ...


class AsyncDraft(Protocol[P_co]):
    """:class:`Draft` for :func:`adrive_live` (``aclose`` stops generating)."""

    def __aiter__(self) -> AsyncIterator[P_co]: ...

    async def aclose(self) -> None: ...

    def answer(self) -> Answer: ...


class GuardIO(Protocol):
    """What an entry point supplies: its generations (each reporting its tokens to ``watch``) and retrievals."""

    def generate(self, request: Generate, watch: Watch) -> Answer: ...

    def retrieve(self, request: Retrieve) -> Retrieved: ...


class MeasuringIO(GuardIO, Protocol):
    """A :class:`GuardIO` that can also take second looks (the backend again: a verification prefill,
    samples, reworded questions), for a policy whose rules read second-look statistics."""

    def measure(self, request: Measure) -> Measured: ...


class LiveIO(GuardIO, Protocol[P_co]):
    """A :class:`GuardIO` that can also stream an answer as a :class:`Draft` (for live runs)."""

    def draft(self, request: Generate, watch: Watch) -> Draft[P_co]: ...


class AsyncGuardIO(Protocol):
    """:class:`GuardIO` for :func:`adrive`."""

    def generate(self, request: Generate, watch: Watch) -> Awaitable[Answer]: ...

    def retrieve(self, request: Retrieve) -> Awaitable[Retrieved]: ...


class AsyncMeasuringIO(AsyncGuardIO, Protocol):
    """:class:`MeasuringIO` for :func:`adrive`."""

    def measure(self, request: Measure) -> Awaitable[Measured]: ...


class AsyncLiveIO(AsyncGuardIO, Protocol[P_co]):
    """:class:`LiveIO` for :func:`adrive_live`."""

    def draft(self, request: Generate, watch: Watch) -> AsyncDraft[P_co]: ...


# -- the steps of one question, written once for both colours -----------------------------------------
_NO_SPAN = RunSpan(None)
Reply = Answer | Retrieved | Measured
RequestSpan = GenerationSpan | RetrievalSpan | SecondLookSpan


@dataclass(frozen=True)
class _Call:
    """A request the I/O answers whole: ``call()`` (awaited in the async colour) inside ``span``, then
    ``done(span, reply)`` records the reply on the span and gives what goes back to the loop."""

    span: RequestSpan
    call: Callable[[], Any]
    done: Callable[[Any, Any], Reply]


@dataclass(frozen=True)
class _Stream:
    """A ``Generate`` whose answer streams to the reader: ``io.draft(request, watch)``, in ``span``
    (not current across the yields: ended by the loop)."""

    request: Generate
    watch: Watch
    span: GenerationSpan


def _retrieved(opened: RetrievalSpan, reply: Retrieved) -> Retrieved:
    opened.record(reply.passages, reply.why)
    return reply


def _measured(opened: SecondLookSpan, reply: Measured) -> Measured:
    opened.record(reply.measurements)
    return reply


class _Loop:
    """One question between its requests: what each asks of the I/O and in which span (:meth:`next`),
    its reply sent on (:meth:`send`), a streamed draft's end, close or failure, the conclusion."""

    def __init__(self, driver: Driver, question: str | Progress, io: object, live: Live) -> None:
        if live not in ("held", "first", "all"):
            msg = f"live must be 'held', 'first' or 'all', got {live!r}"
            raise UsageError(msg)
        self.driver, self.live = driver, live
        self.io: Any = io  # a GuardIO of the caller's colour (measure() is checked: _check_measures)
        self.result: GuardResult | None = None
        self.progress = question if isinstance(question, Progress) else Progress(question)
        self.decider = driver.decider if isinstance(driver.decider, Decider) else None
        if self.decider is not None:
            _check_measures(self.decider, io)
        self.steps = guard_steps(self.decider if self.decider is not None else self.pick, self.progress)
        self.request: Request = next(self.steps)

    def pick(self, generation: Generation) -> Decider:
        """The decider the first answer picks (:data:`DeciderFor`), checked as a given one is."""
        picking: Any = self.driver.decider  # a DeciderFor: self.decider was None
        decider: Decider = picking(generation)
        _check_measures(decider, self.io)
        self.decider = decider
        return decider

    def next(self) -> _Call | _Stream | None:
        """What the current request asks of the I/O; None once the loop has concluded."""
        request, io, span = self.request, self.io, self.driver.span
        if isinstance(request, Conclude):
            return None
        if isinstance(request, Retrieve):
            return _Call(span.retrieval(request.number), functools.partial(io.retrieve, request), _retrieved)
        if isinstance(request, Measure):
            return _Call(span.second_look(request.attempt, request.looks), functools.partial(io.measure, request), _measured)
        watch = Watch(self.decider, self.driver.top_n)
        opened = span.generation(request.attempt, self.driver.span_input)
        if self.live == "all" or (self.live == "first" and request.first):
            return _Stream(request, watch, opened)
        return _Call(opened, functools.partial(io.generate, request, watch), functools.partial(self.answered, watch))

    def send(self, reply: Reply) -> None:
        self.request = self.steps.send(reply)

    @staticmethod
    def answered(watch: Watch, opened: GenerationSpan, answer: Answer) -> Answer:
        """``answer`` marked ``stopped_early`` when its watch stopped it, recorded on its span."""
        if watch.stopped and not answer.stopped_early:
            answer = replace(answer, stopped_early=True)
        if answer.generation is not None:
            opened.record(answer.generation)
        return answer

    def ended(self, stream: _Stream, draft: Draft[Any] | AsyncDraft[Any]) -> Answer:
        answer = self.answered(stream.watch, stream.span, draft.answer())
        stream.span.end()
        return answer

    def closed(self, stream: _Stream, draft: Draft[Any] | AsyncDraft[Any]) -> None:
        """The reader closed the stream (the draft is stopped already): decide and record what it generated
        (nothing generated: the span ends marked abandoned); no retrieval is spent."""
        generation = draft.answer().generation
        stream.span.end_with(generation)
        span = self.driver.span
        if generation is None:
            span.abandon(ABANDONED)
            return
        decider = self.decider if self.decider is not None else self.pick(generation)
        result = self.progress.abandon(decider, generation)
        span.end(result)
        self.result = self.driver.result = result

    @staticmethod
    def failed(stream: _Stream, exc: BaseException) -> None:
        stream.span.fail(exc)
        stream.span.end()

    def concluded(self) -> GuardResult:
        request = self.request
        if not isinstance(request, Conclude):  # pragma: no cover - next() returned None
            msg = "internal error: the guard loop has not concluded"
            raise UsageError(msg)
        self.driver.span.concluded(request.result)
        self.result = self.driver.result = request.result
        return request.result


def _check_measures(decider: Decider, io: object) -> None:
    """A policy that reads second-look statistics needs an I/O that can measure them: say so before generating."""
    wanted = decider.policy.second_look_stats()
    if wanted and not callable(getattr(io, "measure", None)):
        msg = (
            f"policy {decider.policy.name!r} reads second-look statistics {sorted(wanted)}, which need the model again "
            f"(a verification prefill, samples, reworded questions); this entry point's I/O ({type(io).__name__}) has no "
            "measure(): guard with logtoku_guard.Guard (or its BackendIO), or use a policy without second-look rules"
        )
        raise UsageError(msg)


# -- the two colours: the same loop, differing only by await ---------------------------------------------
def _drive(loop: _Loop) -> Generator[Any, None, GuardResult]:
    while (step := loop.next()) is not None:
        if isinstance(step, _Call):
            with step.span as opened:
                reply = step.done(opened, step.call())
        else:
            draft: Draft[Any] = loop.io.draft(step.request, step.watch)
            try:
                yield from draft  # closing this generator closes the draft's iterator first
            except GeneratorExit:
                draft.close()
                loop.closed(step, draft)
                raise
            except BaseException as exc:
                loop.failed(step, exc)
                raise
            reply = loop.ended(step, draft)
        loop.send(reply)
    return loop.concluded()


async def _adrive(loop: _Loop) -> AsyncGenerator[Any, None]:
    while (step := loop.next()) is not None:
        if isinstance(step, _Call):
            with step.span as opened:
                reply = step.done(opened, await step.call())
        else:
            draft: AsyncDraft[Any] = loop.io.draft(step.request, step.watch)
            try:
                async for piece in draft:
                    yield piece
            except GeneratorExit:
                await draft.aclose()
                loop.closed(step, draft)
                raise
            except BaseException as exc:
                loop.failed(step, exc)
                raise
            reply = loop.ended(step, draft)
        loop.send(reply)
    loop.concluded()


class Driver:
    """The one driver of the guard loop, bound to one call: what decides, the question's span, the watch's top-N.

    ``decider``: the call's :class:`~logtoku_guard.decision.decider.Decider`, or how the first answer
    picks it (:data:`DeciderFor`: a model known only by its answers; its first answer is then not
    watched for ``early_stop`` rules: nothing can stop it before its model is known). ``top_n``: the
    top-N of the backend that makes the tokens (what the ``early_stop`` watch aggregates over).
    ``span``: the question's run span (each request gets a child span; the result goes on it; it
    is not ended here, except for an abandoned stream); ``span_input``: what the generation spans
    show as their input. Built by the call's owner
    (:meth:`~logtoku_guard.guard.guard.GuardCall.driver`); cheap, one per question.

    Entry points hand it only the question and their I/O: :meth:`drive`, :meth:`adrive`,
    :meth:`drive_live`, :meth:`adrive_live`. ``question``: the question, or its
    :class:`~logtoku_guard.guard.guard_steps.Progress` when the entry point spent time on it before
    the loop (:meth:`~logtoku_guard.guard.guard_steps.Progress.spent_before`). :attr:`result`: the
    last question's result, concluded or abandoned (a reader who closed a live stream cannot be
    returned anything).
    """

    def __init__(
        self,
        decider: Decider | DeciderFor,
        *,
        top_n: int = DEFAULT_TOP_N,
        span: RunSpan | None = None,
        span_input: Sequence[ChatMessage] | str | None = None,
    ) -> None:
        self.decider = decider
        self.top_n = top_n
        self.span = span if span is not None else _NO_SPAN
        self.span_input = span_input
        self.result: GuardResult | None = None

    def drive(self, question: str | Progress, io: GuardIO) -> GuardResult:
        """Guard ``question`` with every draft held: the result (the ``raise`` action is not raised here)."""
        steps = _drive(_Loop(self, question, io, "held"))
        try:
            while True:
                next(steps)
        except StopIteration as stop:
            return stop.value

    async def adrive(self, question: str | Progress, io: AsyncGuardIO) -> GuardResult:
        """:meth:`drive` for async entry points (the decisions run in the caller's loop: they are quick)."""
        loop = _Loop(self, question, io, "held")
        async for _ in _adrive(loop):
            pass
        return cast("GuardResult", loop.result)  # _adrive ended: concluded

    def drive_live(
        self, question: str | Progress, io: LiveIO[P] | GuardIO, live: Live = "first"
    ) -> Generator[P, None, GuardResult]:
        """Guard ``question``: yields the pieces of the answers ``live`` streams (``io`` is a
        :class:`LiveIO` unless ``live`` is ``"held"``), returns the result. Closing the generator
        before it returns (the reader gone) stops the draft being streamed and records it as
        abandoned (:attr:`result`)."""
        return _drive(_Loop(self, question, io, live))

    def adrive_live(
        self, question: str | Progress, io: AsyncLiveIO[P] | AsyncGuardIO, live: Live = "first"
    ) -> AsyncGenerator[P, None]:
        """:meth:`drive_live` for async entry points; an async generator cannot return, so the result
        is :attr:`result` once it has ended."""
        return _adrive(_Loop(self, question, io, live))


def raise_for_action(result: GuardResult) -> GuardResult:
    """The policy's ``raise`` action, written once for every entry point: :class:`GuardRejectedError`
    carrying ``result`` when its action is ``raise``, else ``result``. Called once the entry point
    has reported the result (:meth:`Driver.drive` returns it without raising)."""
    if result.action == "raise":
        raise GuardRejectedError(result)
    return result


# -- the function forms, for a caller with a driver or only a decider (no span, the default top-N) ---------
def _driver(driver: Driver | Decider | DeciderFor) -> Driver:
    return driver if isinstance(driver, Driver) else Driver(driver)


def drive(driver: Driver | Decider | DeciderFor, question: str | Progress, io: GuardIO) -> GuardResult:
    """:meth:`Driver.drive`."""
    return _driver(driver).drive(question, io)


async def adrive(driver: Driver | Decider | DeciderFor, question: str | Progress, io: AsyncGuardIO) -> GuardResult:
    """:meth:`Driver.adrive`."""
    return await _driver(driver).adrive(question, io)


def drive_live(
    driver: Driver | Decider | DeciderFor, question: str | Progress, io: LiveIO[P] | GuardIO, live: Live = "first"
) -> Generator[P, None, GuardResult]:
    """:meth:`Driver.drive_live`."""
    return _driver(driver).drive_live(question, io, live)


def adrive_live(
    driver: Driver | Decider | DeciderFor, question: str | Progress, io: AsyncLiveIO[P] | AsyncGuardIO, live: Live = "first"
) -> AsyncGenerator[P, None]:
    """:meth:`Driver.adrive_live` (pass a :class:`Driver` to read its :attr:`~Driver.result` once the stream has ended)."""
    return _driver(driver).adrive_live(question, io, live)
