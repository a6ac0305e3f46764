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
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.base import Backend
from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.decision.results import GuardRejectedError, GuardResult
from logtoku_guard.guard.driver import GuardIO, drive
from logtoku_guard.guard.guard_io import BackendIO
from logtoku_guard.guard.guard_stream import GuardStream
from logtoku_guard.guard.retriever_calls import RetrieverLike
from logtoku_guard.guard.telemetry import GuardTelemetry
from logtoku_guard.types import DecodingOptions, Prompt, question_of, to_messages

if TYPE_CHECKING:
    from logtoku_guard.audit.records import RecordSink
    from logtoku_guard.calibration import ModelProfile

__all__ = ["Guard"]

logger = logging.getLogger(__name__)


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
            quantile thresholds and quadrant shares.
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
        profile: ModelProfile | None = None,
        options: DecodingOptions | None = None,
        system: str | None = None,
        tracer_provider: Any = None,
        telemetry: GuardTelemetry | None = None,
    ) -> None:
        self.backend = backend
        self.policy = policy or default_policy()
        self.retriever = retriever
        self.store = store
        self.profile = profile
        self.options = options or DecodingOptions(max_new_tokens=128)
        self.system = system
        if profile is not None:
            profile.check_matches(backend.model_name, backend.k, backend.evidence)
        self.decider = Decider(self.policy, profile, store=store)
        self.quadrants = self.decider.quadrants
        self.telemetry = telemetry if telemetry is not None else GuardTelemetry(tracer_provider)

    def run(self, prompt: Prompt, *, io: GuardIO | None = None) -> GuardResult:
        """Answer ``prompt`` and apply the policy (raises :class:`GuardRejectedError` for ``raise``).

        An ``early_stop`` rule stops a generation as soon as it fires on the answer so far (the
        result says ``stopped_early``), as in :meth:`stream`. ``io``: what makes the generations
        and retrievals the loop asks for (default: this guard's backend, options and retriever,
        :class:`~logtoku_guard.guard.guard_io.BackendIO`); an adapter that generates its own way passes
        its own :class:`~logtoku_guard.guard.driver.GuardIO` for the same prompt.
        """
        messages = to_messages(prompt, self.system)
        io = io if io is not None else BackendIO.of(self, messages)
        span = self.telemetry.start_run(self, messages)
        with span:  # current while driving (instrumented calls nest under it); records an error, ends
            result = drive(self.decider, question_of(messages), io, top_n=self.backend.top_n, span=span, span_input=messages)
            if result.action == "raise":
                raise GuardRejectedError(result)
        return result

    async def arun(self, prompt: Prompt) -> GuardResult:
        """:meth:`run` in a worker thread (generation is CPU/GPU bound)."""
        return await asyncio.to_thread(self.run, prompt)

    def stream(self, prompt: Prompt) -> GuardStream:
        """Stream the first attempt's tokens while watching ``early_stop`` rules.

        When such a rule fires on the prefix, generation stops at once (the result says
        ``stopped_early``) and the policy acts on what was generated. The decision, any
        retrieval and the record are made when the stream ends: read ``.result``.
        """
        return GuardStream(self, to_messages(prompt, self.system))
