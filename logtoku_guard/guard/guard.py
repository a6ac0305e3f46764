"""The one orchestrator: generate -> score -> decide -> act -> record.

``Guard(backend, policy, retriever=..., store=...)`` answers a question and decides, from the
answer's own token uncertainties, whether to pass it, pass it with a disclaimer, retrieve
context and regenerate, abstain, send it to a human, or raise. Framework-free: the LangChain
and LlamaIndex adapters are thin layers over the same pieces.

Its public surface is what a user needs: :meth:`Guard.run` (and :meth:`~Guard.arun`),
:meth:`Guard.stream`, and the attributes it was built from, with :attr:`Guard.decider` (the
backend-free :class:`~logtoku_guard.decision.decider.Decider`: ``decide`` an answer you already have,
``conclude`` a decision into a recorded result) and :attr:`Guard.quadrants`. The loop itself is
:func:`~logtoku_guard.guard.guard_steps.guard_steps` (written once, without I/O), driven by the one
driver (:mod:`logtoku_guard.guard.driver`, which also watches ``early_stop`` rules in :meth:`Guard.run`)
with :class:`~logtoku_guard.guard.guard_io.BackendIO` (the backend and the retriever).

Failures stay contained: the retriever runs in a daemon worker thread and is given up after
``policy.retrieve.timeout_s`` (the stuck thread is abandoned, not killed: Python cannot stop
a thread); a retrieved context too long for the model's window is trimmed passage by passage
(then the fallback), and recorded; a :class:`GuardStream` closed or dropped before its end
records what was generated (``finish_reason`` ``"cancelled"``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any, Literal

from logtoku_guard.backends.base import Backend
from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.decision.results import GuardResult
from logtoku_guard.errors import UsageError
from logtoku_guard.guard.driver import Driver, GuardIO, raise_for_action
from logtoku_guard.guard.guard_io import BackendIO
from logtoku_guard.guard.guard_stream import GuardStream
from logtoku_guard.guard.retriever_calls import RetrieverLike
from logtoku_guard.guard.telemetry import GuardTelemetry
from logtoku_guard.types import DecodingOptions, Prompt, question_of, to_messages

if TYPE_CHECKING:
    from collections.abc import Sequence

    from logtoku_guard.audit.records import RecordSink
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.guard.telemetry import RunSpan
    from logtoku_guard.types import ChatMessage

__all__ = ["Guard", "GuardCall"]

logger = logging.getLogger(__name__)


class _Unset:
    """The default of a per-call ``retriever``: the guard's own (None means no retriever for this call)."""


_UNSET = _Unset()


class Guard:
    """Answer, score, decide, act and record.

    Args:
        backend: any :class:`~logtoku_guard.backends.base.Backend`.
        policy: a :class:`Policy` (default: :func:`default_policy`, which needs a profile).
        retriever: for the ``retrieve`` action: ``retrieve(query)`` or a callable returning
            passages (strings, or objects with ``.text``/``.page_content``).
        store: an :class:`~logtoku_guard.audit.AuditStore` (any
            :class:`~logtoku_guard.audit.records.RecordSink`); every decision is recorded there,
            and ``human_review`` needs it.
        profile: the model's :class:`~logtoku_guard.calibration.ModelProfile`, needed for
            quantile thresholds and quadrant shares; ``"auto"``: the backend's model's saved (else
            shipped) profile, or None (the one place "auto" is resolved; ``cache_dir``: where saved
            profiles are, default the model cache).
        options: decoding options for every generation.
        system: a system message for every generation.
        tracer_provider: OpenTelemetry spans of every decision go there (default: the global
            provider, when OpenTelemetry is installed); or pass ``telemetry=GuardTelemetry(...)``.

    Methods: :meth:`run`, :meth:`arun`, :meth:`stream`. Attributes: the arguments above,
    :attr:`telemetry`, :attr:`decider` (the policy, profile and store as a backend-free
    :class:`~logtoku_guard.decision.decider.Decider`) and :attr:`quadrants`.
    """

    def __init__(
        self,
        backend: Backend,
        policy: Policy | None = None,
        *,
        retriever: RetrieverLike | None = None,
        store: RecordSink | None = None,
        profile: ModelProfile | Literal["auto"] | None = None,
        options: DecodingOptions | None = None,
        system: str | None = None,
        tracer_provider: Any = None,
        telemetry: GuardTelemetry | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.backend = backend
        self.policy = policy or default_policy()
        self.retriever = retriever
        self.store = store
        if profile == "auto":
            from logtoku_guard.calibration.profiles import load_profile_for

            profile = load_profile_for(backend.model_name, backend.k, backend.evidence, cache_dir)
        self.profile: ModelProfile | None = profile
        self.options = options or DecodingOptions(max_new_tokens=128)
        self.system = system
        if profile is not None:
            profile.check_matches(backend.model_name, backend.k, backend.evidence)
        self.decider = Decider(self.policy, profile, store=store)
        self.quadrants = self.decider.quadrants
        self.telemetry = telemetry if telemetry is not None else GuardTelemetry(tracer_provider)

    def call(
        self,
        *,
        backend: Backend | None = None,
        retriever: RetrieverLike | _Unset | None = _UNSET,
        options: DecodingOptions | None = None,
    ) -> GuardCall:
        """This guard for one call: what a call may change (the backend that generates, e.g. one
        that watches the client or traces the call; the retriever bound to the call; the decoding
        options), over what was built and checked once (the policy, the profile, the store, the
        decider, the telemetry).

        A per-call ``backend`` must be the same model as this guard's (name, K, evidence): the profile
        and the decider were checked against it; build another :class:`Guard` for another model.
        """
        if backend is not None and backend is not self.backend:
            mine = (self.backend.model_name, self.backend.k, self.backend.evidence)
            theirs = (backend.model_name, backend.k, backend.evidence)
            if theirs != mine:
                msg = (
                    f"this guard was built for model {mine[0]!r} (k={mine[1]}, evidence {mine[2]!r}); the call's backend "
                    f"is {theirs[0]!r} (k={theirs[1]}, evidence {theirs[2]!r}): build a Guard for that backend"
                )
                raise UsageError(msg)
        return GuardCall(
            self,
            backend if backend is not None else self.backend,
            self.retriever if isinstance(retriever, _Unset) else retriever,
            options if options is not None else self.options,
        )

    def run(
        self,
        prompt: Prompt,
        *,
        io: GuardIO | None = None,
        backend: Backend | None = None,
        retriever: RetrieverLike | _Unset | None = _UNSET,
        options: DecodingOptions | None = None,
    ) -> GuardResult:
        """Answer ``prompt`` and apply the policy (raises :class:`GuardRejectedError` for ``raise``).

        An ``early_stop`` rule stops a generation as soon as it fires on the answer so far (the
        result says ``stopped_early``), as in :meth:`stream`. ``io``: what makes the generations
        and retrievals the loop asks for (default: this guard's backend, options and retriever,
        :class:`~logtoku_guard.guard.guard_io.BackendIO`); an adapter that generates its own way passes
        its own :class:`~logtoku_guard.guard.driver.GuardIO` for the same prompt. ``backend``,
        ``retriever``, ``options``: this call's, in place of the guard's (:meth:`call`).
        """
        return self.call(backend=backend, retriever=retriever, options=options).run(prompt, io=io)

    async def arun(
        self,
        prompt: Prompt,
        *,
        backend: Backend | None = None,
        retriever: RetrieverLike | _Unset | None = _UNSET,
        options: DecodingOptions | None = None,
    ) -> GuardResult:
        """:meth:`run` in a worker thread (generation is CPU/GPU bound)."""
        call = self.call(backend=backend, retriever=retriever, options=options)
        return await asyncio.to_thread(call.run, prompt)

    def stream(
        self,
        prompt: Prompt,
        *,
        backend: Backend | None = None,
        retriever: RetrieverLike | _Unset | None = _UNSET,
        options: DecodingOptions | None = None,
    ) -> GuardStream:
        """Stream the first attempt's tokens while watching ``early_stop`` rules.

        When such a rule fires on the prefix, generation stops at once (the result says
        ``stopped_early``) and the policy acts on what was generated. The decision, any
        retrieval and the record are made when the stream ends: read ``.result``.
        """
        return self.call(backend=backend, retriever=retriever, options=options).stream(prompt)


class GuardCall:
    """One call of a :class:`Guard` (:meth:`Guard.call`): the guard's policy, profile, store, decider
    and telemetry, with this call's backend, retriever and options. Cheap to make: nothing is
    validated or built again."""

    def __init__(self, guard: Guard, backend: Backend, retriever: RetrieverLike | None, options: DecodingOptions) -> None:
        self.guard = guard
        self.backend = backend
        self.retriever = retriever
        self.options = options

    @property
    def policy(self) -> Policy:
        return self.guard.policy

    @property
    def profile(self) -> ModelProfile | None:
        return self.guard.profile

    @property
    def decider(self) -> Decider:
        return self.guard.decider

    @property
    def telemetry(self) -> GuardTelemetry:
        return self.guard.telemetry

    def driver(self, span: RunSpan | None = None, span_input: Sequence[ChatMessage] | str | None = None) -> Driver:
        """The one driver for a question of this call: the guard's decider, this backend's top-N (what
        the ``early_stop`` watch aggregates over), the question's run ``span`` (from
        ``telemetry.start_run``) and what its generation spans show as input."""
        return Driver(self.decider, top_n=self.backend.top_n, span=span, span_input=span_input)

    def run(self, prompt: Prompt, *, io: GuardIO | None = None) -> GuardResult:
        """:meth:`Guard.run` with this call's backend, retriever and options."""
        messages = to_messages(prompt, self.guard.system)
        io = io if io is not None else BackendIO.of(self, messages)
        span = self.telemetry.start_run(self, messages)
        with span:  # current while driving (instrumented calls nest under it); records an error, ends
            return raise_for_action(self.driver(span, messages).drive(question_of(messages), io))

    def stream(self, prompt: Prompt) -> GuardStream:
        """:meth:`Guard.stream` with this call's backend, retriever and options."""
        return GuardStream(self, to_messages(prompt, self.guard.system))
