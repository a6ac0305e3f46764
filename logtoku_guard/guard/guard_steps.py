"""The guard loop, written once and without I/O: :func:`guard_steps` yields requests, drivers answer.

One guarded question is answer -> decide -> (retrieve -> answer with the context -> decide)* ->
conclude. :func:`guard_steps` owns every decision of that loop (through a
:class:`~logtoku_guard.decision.decider.Decider`): how many retrievals, the fallback and its reason, what
each attempt records, the timings. It never generates, retrieves or records by itself: it
yields a request and is sent the answer::

    steps = guard_steps(decider, Progress(question))
    request = next(steps)                     # Generate(attempt=1)
    while not isinstance(request, Conclude):
        Generate(attempt, passages)  -> send an Answer (the generation; for attempt > 1 made
                                        with request.prompt(...), the retrieved context)
        Retrieve(question, number)   -> send Retrieved(passages) or Retrieved(why=...)
        Measure(looks, question, answer, ...) -> send Measured(measurements): the second looks a
                                        policy rule reached (never the samples' text)
    request.result                            # the GuardResult, recorded ("raise": driver.raise_for_action)

One driver answers it for every way of guarding (:mod:`logtoku_guard.guard.driver`: early stop, held
or live drafts, spans); the entry points hand that driver only their generations and retrievals.

The time between a request and its answer is the driver's: the generator adds it to the
question's generation or retrieval seconds (:class:`Progress`), and its own decisions to the
decision seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.results import Attempt, GuardResult, GuardTimings
from logtoku_guard.errors import UsageError
from logtoku_guard.scoring.second_look import Look, Measurement, SecondLooks, SecondLookSettings
from logtoku_guard.types import Generation

if TYPE_CHECKING:
    from logtoku_guard.decision.policy import Decision, RetrieveSettings

__all__ = [
    "Answer",
    "Conclude",
    "DeciderFor",
    "Generate",
    "Measure",
    "Measured",
    "Progress",
    "Request",
    "Retrieve",
    "Retrieved",
    "Steps",
    "guard_steps",
]


# -- requests -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Generate:
    """Answer the question: attempt ``attempt`` (1 = the first answer, to the question as asked;
    later ones with the retrieved ``passages``: :meth:`prompt` is the augmented user turn).
    Send back an :class:`Answer`."""

    attempt: int
    question: str
    passages: tuple[str, ...] = ()
    settings: RetrieveSettings | None = None

    @property
    def first(self) -> bool:
        return self.attempt == 1

    def prompt(self, passages: Sequence[str] | None = None) -> str:
        """The augmented user turn (the policy's ``retrieve.context_template``) with ``passages``
        (default: all of :attr:`passages`; fewer when the context must be trimmed)."""
        if self.settings is None:
            msg = f"attempt {self.attempt} is the first answer, made from the question as asked: it has no augmented prompt"
            raise UsageError(msg)
        return self.settings.prompt(self.question, self.passages if passages is None else passages)


@dataclass(frozen=True)
class Retrieve:
    """Retrieve context for ``question``; this is retrieval number ``number`` (1 = the first),
    asked for by ``decision``. Send back :class:`Retrieved`."""

    question: str
    number: int
    decision: Decision


@dataclass(frozen=True)
class Measure:
    """Take the second ``looks`` of ``answer`` (the answer to attempt ``attempt``, made from ``question``
    and, after a retrieval, ``passages`` through ``retrieve``'s template), measured with ``settings``:
    a policy rule reached their statistics. Send back :class:`Measured`. The looks' samples stay
    with whoever takes them: nothing of them but the statistics, cost and inputs comes back."""

    looks: tuple[Look, ...]
    question: str
    answer: Generation
    attempt: int
    settings: SecondLookSettings
    passages: tuple[str, ...] = ()
    retrieve: RetrieveSettings | None = None


@dataclass(frozen=True)
class Conclude:
    """The loop is over: ``result`` is decided and recorded. The driver reports it; the entry point,
    once it has reported it too, takes the ``raise`` action with
    :func:`~logtoku_guard.guard.driver.raise_for_action` (:class:`~logtoku_guard.decision.results.GuardRejectedError`)."""

    result: GuardResult


Request = Generate | Retrieve | Measure | Conclude
DeciderFor = Callable[[Generation], Decider]
"""How the first answer picks its decider, for a model known only by its answers (LangChain's
middleware over any chat model: the answer's model name, K and evidence pick the profile)."""
Steps = Generator[Request, Any, None]
"""What :func:`guard_steps` returns: send an :class:`Answer` to a :class:`Generate`, a
:class:`Retrieved` to a :class:`Retrieve`, a :class:`Measured` to a :class:`Measure`."""


# -- answers ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """What a :class:`Generate` made.

    ``generation``: None when no answer could be made with the context (then ``note`` says why
    and the loop falls back). ``passages``: the context the answer was made from (recorded in
    its attempt). ``note``: how the context was trimmed (recorded as the attempt's
    ``retrieval_error``). ``text``: the answer as the reader got it, when it differs from the
    generation's. ``stopped_early``: an ``early_stop`` rule cut the generation short.
    ``no_context``: why the answer was made with nothing to answer from (then the decision is
    the fallback, without a rule).
    """

    generation: Generation | None
    passages: tuple[str, ...] = ()
    note: str | None = None
    text: str | None = None
    stopped_early: bool = False
    no_context: str | None = None


@dataclass(frozen=True)
class Retrieved:
    """What a :class:`Retrieve` found: ``passages``, or none and ``why`` (then the loop falls back)."""

    passages: tuple[str, ...] = ()
    why: str | None = None


@dataclass(frozen=True)
class Measured:
    """What a :class:`Measure` measured: one :class:`~logtoku_guard.scoring.second_look.Measurement` per look asked for."""

    measurements: tuple[Measurement, ...]


# -- the state of one question --------------------------------------------------------------------
Stage = Literal["generation", "retrieval", "second_look"]


@dataclass
class Progress:
    """One guarded question so far: its attempts, whether it stopped early, the seconds per stage.

    Drivers read it (an abandoned stream concludes from it: :meth:`abandon`); only
    :func:`guard_steps` writes it (and an entry point, before the loop: :meth:`spent_before`).
    """

    question: str
    started: float = field(default_factory=time.perf_counter)
    attempts: list[Attempt] = field(default_factory=list)
    stopped_early: bool = False
    generation_s: float = 0.0
    decision_s: float = 0.0
    retrieval_s: float = 0.0
    second_look_s: float = 0.0
    second_looks: list[Measurement] = field(default_factory=list)
    waiting: tuple[Stage, float] | None = None  # the request being answered now, since when

    def timings(self) -> GuardTimings:
        """The timings so far (a request being answered counts up to now)."""
        now = time.perf_counter()
        spent = {"generation": self.generation_s, "retrieval": self.retrieval_s, "second_look": self.second_look_s}
        if self.waiting is not None:
            stage, since = self.waiting
            spent[stage] += now - since
        return GuardTimings(
            now - self.started, spent["generation"], self.decision_s, spent["retrieval"], second_look_s=spent["second_look"]
        )

    def spent_before(self, stage: Stage, seconds: float) -> None:
        """Count ``seconds`` the entry point spent on ``stage`` before the loop's first request (LlamaIndex
        retrieves the context of its first answer first): the one write to a progress outside :func:`guard_steps`."""
        if stage == "generation":
            self.generation_s += seconds
        elif stage == "retrieval":
            self.retrieval_s += seconds
        else:
            self.second_look_s += seconds

    def abandon(self, decider: Decider, generation: Generation) -> GuardResult:
        """Decide and record ``generation``, whose stream the reader closed before it ended (no retrieval)."""
        return decider.abandon(self.question, generation, self.attempts, self.timings())


def _ask(progress: Progress, request: Generate | Retrieve | Measure) -> Generator[Request, Any, Any]:
    stage: Stage = (
        "generation" if isinstance(request, Generate) else "retrieval" if isinstance(request, Retrieve) else "second_look"
    )
    progress.waiting = (stage, time.perf_counter())
    reply = yield request
    spent = time.perf_counter() - progress.waiting[1]
    progress.waiting = None
    if stage == "generation":
        progress.generation_s += spent
    elif stage == "retrieval":
        progress.retrieval_s += spent
    else:
        progress.second_look_s += spent
    return reply


def _second_looks(
    decider: Decider, progress: Progress, generation: Generation, answer: Answer, attempt: int
) -> Generator[Request, Any, SecondLooks]:
    """The second looks ``generation``'s decision needs, asked for one round at a time (a rule's looks
    at once, then the next undetermined rule's, if any) until the decision is settled."""
    looks = SecondLooks()
    policy = decider.policy
    while needed := decider.looks_needed(generation, looks):
        retrieve = policy.retrieve if answer.passages else None
        request = Measure(needed, progress.question, generation, attempt, policy.second_look, answer.passages, retrieve)
        t = time.perf_counter()
        measured = yield from _ask(progress, request)
        progress.decision_s -= time.perf_counter() - t  # the caller times the decision around this
        got = {m.look for m in measured.measurements} if isinstance(measured, Measured) else set()
        missing = [lk for lk in needed if lk not in got]
        if missing:
            msg = f"the second look {missing} was asked for and not measured: answer a Measure with Measured(...) of every look"
            raise UsageError(msg)
        taken = [m for m in measured.measurements if m.look in needed and not looks.taken(m.look)]
        looks = looks.with_(taken)
        progress.second_looks.extend(taken)
    return looks


# -- the loop ---------------------------------------------------------------------------------------
def guard_steps(decider: Decider | DeciderFor, progress: Progress) -> Steps:
    """The requests of one guarded question, from its first answer to :class:`Conclude`.

    ``decider``: or how the first answer picks it (:data:`DeciderFor`: called once, with the
    first answer's generation).

    Each answer is decided (:meth:`Decider.decide`, or :meth:`Decider.unanswerable` for an
    answer with ``no_context``) and recorded in ``progress.attempts``; :meth:`Decider.settle`
    says whether to retrieve. A retrieval that brings nothing, or context that fits nowhere,
    falls back (:meth:`Decider.give_up`) with the reason recorded on the attempt.
    """
    question, attempts = progress.question, progress.attempts
    answer: Answer = yield from _ask(progress, Generate(1, question))
    if answer.generation is None:
        msg = "the first answer must be a generation: Answer(generation=None) is only for an answer the context did not fit"
        raise UsageError(msg)
    decider = decider if isinstance(decider, Decider) else decider(answer.generation)
    text = answer.text
    generation: Generation = answer.generation
    while True:
        progress.stopped_early = progress.stopped_early or answer.stopped_early
        t = time.perf_counter()
        if answer.no_context is not None:
            judged = decider.unanswerable(generation, answer.no_context)
        else:
            looks = yield from _second_looks(decider, progress, generation, answer, len(attempts) + 1)
            judged = decider.decide(generation, attempts, looks)
        attempts.append(Attempt(generation, judged, answer.passages, answer.note))
        decision = decider.settle(attempts)
        progress.decision_s += time.perf_counter() - t
        if decision.action != "retrieve":
            break
        retrieved: Retrieved = yield from _ask(progress, Retrieve(question, len(attempts), decision))
        why = retrieved.why
        if why is None:
            settings = decider.policy.retrieve
            request = Generate(len(attempts) + 1, question, tuple(retrieved.passages), settings)
            answer = yield from _ask(progress, request)
            if answer.generation is not None:
                text, generation = answer.text, answer.generation
                continue
            why = answer.note or "no answer could be made with the retrieved context"
        attempts[-1] = replace(attempts[-1], retrieval_error=why)
        decision = decider.give_up(decision, why)
        break
    timings = progress.timings()
    result = decider.conclude(
        question, decision, attempts, timings, stopped_early=progress.stopped_early, text=text, second_looks=progress.second_looks
    )
    yield Conclude(result)
