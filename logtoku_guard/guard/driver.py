"""The one driver of the guard loop: every entry point hands it *generate* and *retrieve*, nothing more.

:func:`~logtoku_guard.guard.guard_steps.guard_steps` decides (written once, without I/O); this module
answers its requests, for every way of guarding: :class:`~logtoku_guard.guard.guard.Guard` (``run``,
``arun``, ``stream``; the server runs ``Guard.run``), LangChain's ``LogTokUGuard`` and
``LogTokUMiddleware``, LlamaIndex's ``LogTokUQueryEngine`` (every stream mode). An entry point
supplies a :class:`GuardIO` (how it generates and retrieves) and, to stream its drafts, a
:class:`LiveIO`; the driver owns the rest:

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
  is generated), in a ``second_look`` span.
* **records**: each generation and retrieval in its child span of the question's
  :class:`~logtoku_guard.guard.telemetry.RunSpan` (when one is given), the result on that span.

Sync (:func:`drive`, :func:`drive_live`) and async (:func:`adrive`, :func:`adrive_live`): the same
loop, once per colour.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from logtoku_guard.errors import UsageError
from logtoku_guard.guard.guard_steps import (
    Answer,
    Conclude,
    Generate,
    Measure,
    Measured,
    Progress,
    Request,
    Retrieve,
    Retrieved,
    Steps,
    guard_steps,
)
from logtoku_guard.guard.telemetry import GenerationSpan, RunSpan
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N

if TYPE_CHECKING:
    from logtoku_guard.decision.decider import Decider
    from logtoku_guard.decision.results import GuardResult
    from logtoku_guard.types import ChatMessage, TokenScore

__all__ = [
    "ABANDONED",
    "AsyncGuardIO",
    "AsyncLiveIO",
    "AsyncMeasuringIO",
    "Draft",
    "GuardIO",
    "Live",
    "LiveIO",
    "MeasuringIO",
    "Watch",
    "adrive",
    "adrive_live",
    "drive",
    "drive_live",
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


# -- the loop's state between requests (shared by both colours) ---------------------------------------
_NO_SPAN = RunSpan(None)


@dataclass
class _Run:
    decider: Decider
    progress: Progress
    top_n: int
    span: RunSpan
    span_input: Sequence[ChatMessage] | str | None
    live: Live
    out: list[GuardResult]
    steps: Steps = field(init=False)

    def __post_init__(self) -> None:
        self.steps = guard_steps(self.decider, self.progress)

    def start(self, first: Answer | None) -> Request:
        request = next(self.steps)
        return self.steps.send(first) if first is not None else request

    def streams(self, request: Generate) -> bool:
        return self.live == "all" or (self.live == "first" and request.first)

    def watch(self) -> Watch:
        return Watch(self.decider, self.top_n)

    def answered(self, answer: Answer, watch: Watch) -> Answer:
        if watch.stopped and not answer.stopped_early:
            return replace(answer, stopped_early=True)
        return answer

    # a streamed draft, for both colours: its span is not current across the yields, so it is ended here
    def draft_span(self, request: Generate) -> GenerationSpan:
        return self.span.generation(request.attempt, self.span_input)

    def draft_ended(self, opened: GenerationSpan, draft: Draft[Any] | AsyncDraft[Any], watch: Watch) -> Answer:
        answer = self.answered(draft.answer(), watch)
        opened.end_with(answer.generation)
        return answer

    def draft_closed(self, opened: GenerationSpan, draft: Draft[Any] | AsyncDraft[Any]) -> None:
        """The reader closed the stream (the draft is stopped already): decide and record what it generated."""
        generation = draft.answer().generation
        opened.end_with(generation)
        self.abandon(generation)

    @staticmethod
    def draft_failed(opened: GenerationSpan, exc: BaseException) -> None:
        opened.fail(exc)
        opened.end()

    def abandon(self, generation: Any) -> GuardResult | None:
        """Decide and record an answer whose stream the reader closed (None: nothing was generated)."""
        if generation is None:
            self.span.abandon(ABANDONED)
            return None
        result = self.progress.abandon(self.decider, generation)
        self.span.end(result)
        self.out.append(result)
        return result

    def concluded(self, request: Conclude) -> GuardResult:
        self.span.concluded(request.result)
        self.out.append(request.result)
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


def _recorded(opened: Any, reply: Answer | Retrieved) -> None:
    if isinstance(reply, Retrieved):
        opened.record(reply.passages, reply.why)
    elif reply.generation is not None:
        opened.record(reply.generation)


def _run(
    decider: Decider,
    question: str | Progress,
    top_n: int,
    span: RunSpan | None,
    span_input: Any,
    live: Live,
    result: list[GuardResult] | None,
) -> _Run:
    if live not in ("held", "first", "all"):
        msg = f"live must be 'held', 'first' or 'all', got {live!r}"
        raise UsageError(msg)
    out = result if result is not None else []
    progress = question if isinstance(question, Progress) else Progress(question)
    return _Run(decider, progress, top_n, span if span is not None else _NO_SPAN, span_input, live, out)


# -- sync -------------------------------------------------------------------------------------------------
def drive_live(
    decider: Decider,
    question: str | Progress,
    io: LiveIO[P] | GuardIO,
    *,
    live: Live = "first",
    top_n: int = DEFAULT_TOP_N,
    span: RunSpan | None = None,
    span_input: Sequence[ChatMessage] | str | None = None,
    first: Answer | None = None,
    result: list[GuardResult] | None = None,
) -> Generator[P, None, GuardResult]:
    """Guard ``question``: yields the pieces of the answers ``live`` streams, returns the result.

    ``question``: the question, or its :class:`~logtoku_guard.guard.guard_steps.Progress` when the
    entry point spent time on it before the loop (counted in the timings). ``io``: the entry
    point's generations and retrievals (a :class:`LiveIO` when ``live`` is not ``"held"``).
    ``span``: the question's run span (each request gets a child span; the result goes on it;
    it is not ended here, except for an abandoned stream). ``first``: the first answer, when
    the entry point made it before the loop (LlamaIndex synthesises it from its first
    retrieval). Closing the generator before it returns (the reader gone) stops the draft being
    streamed and records it as abandoned. ``result``: the result is also appended there
    (concluded, or abandoned: a reader who closed the stream cannot be returned anything).
    """
    _check_measures(decider, io)
    run = _run(decider, question, top_n, span, span_input, live, result)
    request = run.start(first)
    while not isinstance(request, Conclude):
        reply: Answer | Retrieved | Measured
        if isinstance(request, Retrieve):
            with run.span.retrieval(request.number) as opened:
                reply = io.retrieve(request)
                _recorded(opened, reply)
        elif isinstance(request, Measure):
            with run.span.second_look(request.attempt, request.looks) as looked:
                measured: Measured = io.measure(request)  # type: ignore[union-attr]  # _check_measures: it has one
                looked.record(measured.measurements)
                reply = measured
        elif run.streams(request):
            reply = yield from _streamed(run, request, io)
        else:
            watch = run.watch()
            with run.span.generation(request.attempt, span_input) as opened:
                reply = run.answered(io.generate(request, watch), watch)
                _recorded(opened, reply)
        request = run.steps.send(reply)
    return run.concluded(request)


def _streamed(run: _Run, request: Generate, io: Any) -> Generator[Any, None, Answer]:
    watch, opened = run.watch(), run.draft_span(request)
    draft = io.draft(request, watch)
    try:
        yield from draft  # closing this generator closes the draft's iterator first
    except GeneratorExit:
        draft.close()
        run.draft_closed(opened, draft)
        raise
    except BaseException as exc:
        run.draft_failed(opened, exc)
        raise
    return run.draft_ended(opened, draft, watch)


def drive(
    decider: Decider,
    question: str | Progress,
    io: GuardIO,
    *,
    top_n: int = DEFAULT_TOP_N,
    span: RunSpan | None = None,
    span_input: Sequence[ChatMessage] | str | None = None,
    first: Answer | None = None,
) -> GuardResult:
    """:func:`drive_live` with every draft held: the result (the ``raise`` action is not raised here)."""
    gen: Generator[Any, None, GuardResult] = drive_live(
        decider, question, io, live="held", top_n=top_n, span=span, span_input=span_input, first=first
    )
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        return stop.value


# -- async ------------------------------------------------------------------------------------------------
async def adrive_live(
    decider: Decider,
    question: str | Progress,
    io: AsyncLiveIO[P] | AsyncGuardIO,
    *,
    live: Live = "first",
    top_n: int = DEFAULT_TOP_N,
    span: RunSpan | None = None,
    span_input: Sequence[ChatMessage] | str | None = None,
    first: Answer | None = None,
    result: list[GuardResult] | None = None,
) -> AsyncGenerator[P, None]:
    """:func:`drive_live` for async entry points; an async generator cannot return, so the result
    is only appended to ``result``."""
    _check_measures(decider, io)
    run = _run(decider, question, top_n, span, span_input, live, result)
    request = run.start(first)
    while not isinstance(request, Conclude):
        reply: Answer | Retrieved | Measured
        if isinstance(request, Retrieve):
            with run.span.retrieval(request.number) as opened:
                reply = await io.retrieve(request)
                _recorded(opened, reply)
        elif isinstance(request, Measure):
            with run.span.second_look(request.attempt, request.looks) as looked:
                ameasured: Measured = await io.measure(request)  # type: ignore[union-attr]  # _check_measures: it has one
                looked.record(ameasured.measurements)
                reply = ameasured
        elif run.streams(request):
            watch, streamed = run.watch(), run.draft_span(request)
            draft = io.draft(request, watch)  # type: ignore[union-attr]
            try:
                async for piece in draft:
                    yield piece
            except GeneratorExit:
                await draft.aclose()
                run.draft_closed(streamed, draft)
                raise
            except BaseException as exc:
                run.draft_failed(streamed, exc)
                raise
            reply = run.draft_ended(streamed, draft, watch)
        else:
            watch = run.watch()
            with run.span.generation(request.attempt, span_input) as opened:
                reply = run.answered(await io.generate(request, watch), watch)
                _recorded(opened, reply)
        request = run.steps.send(reply)
    run.concluded(request)


async def adrive(
    decider: Decider,
    question: str | Progress,
    io: AsyncGuardIO,
    *,
    top_n: int = DEFAULT_TOP_N,
    span: RunSpan | None = None,
    span_input: Sequence[ChatMessage] | str | None = None,
    first: Answer | None = None,
) -> GuardResult:
    """:func:`drive` for async entry points (the decisions run in the caller's loop: they are quick)."""
    out: list[GuardResult] = []
    async for _ in adrive_live(
        decider, question, io, live="held", top_n=top_n, span=span, span_input=span_input, first=first, result=out
    ):
        pass
    return out[0]
