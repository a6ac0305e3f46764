"""OpenTelemetry traces of every guard decision (optional: ``pip install 'logtoku-guard[otel]'``).

One guarded question is one span tree::

    apply_guardrail logtoku     openinference.span.kind=GUARDRAIL; the decision as logtoku.* attributes
                                (payloads.decision_attributes)
    ├── chat <model>            one per generation (openinference.span.kind=LLM, gen_ai.usage.*)
    ├── retrieve                one per retrieval (openinference.span.kind=RETRIEVER)
    └── chat <model>            the answer made with the retrieved context
    events on the GUARDRAIL span: gen_ai.evaluation.result, one per scored answer

:class:`GuardTelemetry` is what :class:`~logtoku_guard.guard.guard.Guard` (and through it the
LangChain and LlamaIndex adapters) calls; spans go to the ``tracer_provider`` given, else to
OpenTelemetry's global one. Names follow the OpenTelemetry GenAI semantic conventions (still
"development" status) and OpenInference; ``apply_guardrail`` is from the draft GenAI security
proposal (see README, "Telemetry").

Lazy and optional: this module imports nothing from OpenTelemetry; a :class:`GuardTelemetry`
imports ``opentelemetry.trace`` when built, and without OpenTelemetry installed every span is a
no-op that emits and imports nothing. Prompt and answer text become attributes only with
``capture_content=True`` (they may hold personal data).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from logtoku_guard.backends.base import provider_of
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.wire.payloads import decision_attributes

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.decision.results import GuardResult
    from logtoku_guard.scoring.second_look import Measurement
    from logtoku_guard.types import ChatMessage, Generation

__all__ = ["EVALUATION_EVENT", "GenerationSpan", "GuardTelemetry", "Guarded", "RetrievalSpan", "RunSpan"]

INSTRUMENTATION_NAME = "logtoku_guard"
EVALUATION_EVENT = "gen_ai.evaluation.result"


class Guarded(Protocol):
    """What the spans read from a guard (:class:`~logtoku_guard.guard.guard.Guard` has it): the model
    and provider, the policy's name and version, the profile for the reliability percentile."""

    @property
    def backend(self) -> Backend: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def profile(self) -> ModelProfile | None: ...


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _messages_json(messages: Sequence[ChatMessage] | str) -> str:
    """The GenAI conventions' message list (``gen_ai.input.messages``) as JSON."""
    turns = [("user", messages)] if isinstance(messages, str) else [(m.role, m.content) for m in messages]
    return json.dumps([{"role": r, "parts": [{"type": "text", "content": c}]} for r, c in turns])


class _Span:
    """A started OpenTelemetry span (or none: a no-op), usable explicitly or as a context manager.

    As a context manager it is the current span inside the block (so instrumented calls made
    there nest under it), records an exception that leaves the block and ends the span.
    """

    def __init__(self, telemetry: GuardTelemetry | None, span: Any = None) -> None:
        self._telemetry = telemetry
        self._span = span
        self._live = span is not None and span.is_recording()
        self._tokens: list[Any] = []  # one per entered ``with`` (a span may be entered again, nested)
        self._ended = span is None

    def __enter__(self) -> Any:
        if self._span is not None and self._telemetry is not None:
            self._tokens.append(self._telemetry.attach(self._span))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._tokens and self._telemetry is not None:
            self._telemetry.detach(self._tokens.pop())
        if exc is not None:
            self.fail(exc)
        self.end()

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` on the span and set its status to ERROR (nothing once the span has ended)."""
        if self._live and not self._ended and self._telemetry is not None:
            self._span.record_exception(exc)
            self._span.set_attribute("error.type", type(exc).__qualname__)
            self._telemetry.set_error(self._span, f"{type(exc).__name__}: {exc}")

    def end(self) -> None:
        """End the span (once; later calls do nothing)."""
        if not self._ended:
            self._ended = True
            self._span.end()


class GenerationSpan(_Span):
    """The ``chat <model>`` span of one generation."""

    def record(self, generation: Generation) -> Generation:
        """Put the generation's usage and scores on the span; returns ``generation``."""
        if self._live and self._telemetry is not None:
            span = self._span
            span.set_attribute("gen_ai.response.model", generation.model)
            span.set_attribute("gen_ai.usage.input_tokens", generation.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", len(generation.tokens))
            span.set_attribute("gen_ai.response.finish_reasons", [generation.finish_reason])
            reliability = generation.score.reliability
            if _finite(reliability):
                span.set_attribute("logtoku.reliability", reliability)
            if self._telemetry.capture_content:
                span.set_attribute("gen_ai.output.messages", _messages_json([_assistant(generation.text)]))
        return generation

    def end_with(self, generation: Generation | None) -> None:
        """Record ``generation`` (when there is one) and end the span."""
        if generation is not None:
            self.record(generation)
        self.end()


class RetrievalSpan(_Span):
    """The ``retrieve`` span of one retrieval."""

    def record(self, passages: Sequence[Any], why: str | None = None) -> None:
        """How many passages came back, and why there were none (``why``), on the span."""
        if self._live:
            self._span.set_attribute("logtoku.retrieval.passages", len(passages))
            if why is not None:
                self._span.set_attribute("logtoku.retrieval.error", why)


class SecondLookSpan(_Span):
    """The ``second_look`` span of one round of second looks (:mod:`logtoku_guard.scoring.second_look`)."""

    def record(self, measurements: Sequence[Measurement]) -> None:
        """Each look's statistics, cost (tokens, seconds) and inputs as ``logtoku.second_look.<look>.*``."""
        if self._live:
            for m in measurements:
                attributes: dict[str, Any] = {f"logtoku.{k}": v for k, v in m.values.items() if _finite(v)}
                attributes.update({f"logtoku.{k}": v for k, v in m.cost().items()})
                attributes.update({f"logtoku.second_look.{m.look}.{k}": v for k, v in m.inputs.items()})
                if m.why is not None:
                    attributes[f"logtoku.second_look.{m.look}.undefined"] = m.why
                self._span.set_attributes(attributes)


class RunSpan(_Span):
    """The GUARDRAIL span of one guarded question; its children and evaluation events.

    Built by :meth:`GuardTelemetry.start_run`. Use it as a context manager, or call
    :meth:`end` (idempotent) yourself; :meth:`concluded` puts the final decision on it.
    """

    def __init__(self, telemetry: GuardTelemetry | None, span: Any = None, guard: Guarded | None = None) -> None:
        super().__init__(telemetry, span)
        self._guard = guard
        self._context: Any = None
        self._generated: dict[int, int] = {}  # attempt number -> when its generation ended (ns)
        if span is not None and telemetry is not None:
            self._context = telemetry.context_of(span)

    def _child(self, name: str, attributes: dict[str, Any]) -> Any:
        if self._telemetry is None or self._context is None:
            return None
        return self._telemetry.start_span(name, self._context, attributes)

    def generation(self, attempt: int, messages: Sequence[ChatMessage] | str | None = None) -> GenerationSpan:
        """Start the span of generation number ``attempt`` (1 = the first answer)."""
        guard = self._guard
        if not self._live or guard is None:
            return _NOOP_GENERATION
        telemetry = self._telemetry
        model = guard.backend.model_name
        attributes: dict[str, Any] = {
            "openinference.span.kind": "LLM",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "logtoku.attempt": attempt,
        }
        provider = provider_of(guard.backend)
        if provider is not None:
            attributes["gen_ai.provider.name"] = provider
        if telemetry is not None and telemetry.capture_content and messages is not None:
            attributes["gen_ai.input.messages"] = _messages_json(messages)
        return _GenerationOf(self, attempt, telemetry, self._child(f"chat {model}", attributes))

    def retrieval(self, number: int) -> RetrievalSpan:
        """Start the span of retrieval number ``number`` (1 = the first one the guard asked for)."""
        if not self._live:
            return _NOOP_RETRIEVAL
        attributes = {"openinference.span.kind": "RETRIEVER", "logtoku.retrieval.number": number}
        return RetrievalSpan(self._telemetry, self._child("retrieve", attributes))

    def second_look(self, attempt: int, looks: Sequence[str]) -> SecondLookSpan:
        """Start the span of the second ``looks`` taken on attempt ``attempt``'s answer."""
        if not self._live:
            return SecondLookSpan(None)
        attributes = {
            "openinference.span.kind": "EVALUATOR",
            "logtoku.attempt": attempt,
            "logtoku.second_look.looks": list(looks),
        }
        return SecondLookSpan(self._telemetry, self._child("second_look", attributes))

    def concluded(self, result: GuardResult) -> None:
        """The final decision as ``logtoku.*`` attributes, one evaluation event per scored answer;
        the ``raise`` action sets the status to ERROR."""
        if not self._live or self._telemetry is None:
            return
        span = self._span
        decision = result.decision
        for number, attempt in enumerate(result.attempts, 1):
            event: dict[str, Any] = {
                "gen_ai.evaluation.name": "logtoku",
                "gen_ai.evaluation.score.label": attempt.decision.action,
                "gen_ai.evaluation.explanation": attempt.decision.reason,
                "logtoku.attempt": number,
            }
            if _finite(attempt.generation.score.reliability):
                event["gen_ai.evaluation.score.value"] = attempt.generation.score.reliability
            if attempt.decision.rule is not None:
                event["logtoku.rule"] = attempt.decision.rule
            span.add_event(EVALUATION_EVENT, event, timestamp=self._generated.get(number))
        profile = self._guard.profile if self._guard is not None else None
        attributes: dict[str, Any] = dict(decision_attributes(decision, result.attempts, result, profile))
        if self._telemetry.capture_content:
            attributes["output.value"] = result.answer
        span.set_attributes(attributes)
        if result.action == "raise":
            self._telemetry.set_error(span, f"raise: {decision.reason}")

    def abandon(self, why: str) -> None:
        """End the span without a decision: the caller closed the stream before the guard decided
        (``logtoku.abandoned`` = true, ``logtoku.reason`` = ``why``; the status stays unset)."""
        if self._live and not self._ended:
            self._span.set_attributes({"logtoku.abandoned": True, "logtoku.reason": why})
        self.end()

    def end(self, result: GuardResult | None = None) -> None:
        """Put ``result`` on the span (:meth:`concluded`) when given, then end it (once)."""
        if result is not None and not self._ended:
            self.concluded(result)
        super().end()

    def fail(self, exc: BaseException) -> None:
        from logtoku_guard.decision.results import GuardRejectedError

        if isinstance(exc, GuardRejectedError) and self._live and not self._ended:
            self._span.record_exception(exc)  # the status was set by concluded()
            return
        super().fail(exc)


class _GenerationOf(GenerationSpan):
    """A generation span that tells its run when it ended (the time of its evaluation event)."""

    def __init__(self, run: RunSpan, attempt: int, telemetry: GuardTelemetry | None, span: Any) -> None:
        super().__init__(telemetry, span)
        self._run = run
        self._attempt = attempt

    def end(self) -> None:
        if not self._ended:
            self._run._generated[self._attempt] = time.time_ns()
        super().end()


def _assistant(text: str) -> ChatMessage:
    from logtoku_guard.types import ChatMessage

    return ChatMessage("assistant", text)


_NOOP_GENERATION = GenerationSpan(None)
_NOOP_RETRIEVAL = RetrievalSpan(None)


class GuardTelemetry:
    """Where a guard's spans go.

    Args:
        tracer_provider: an OpenTelemetry ``TracerProvider``; default: the global one
            (``opentelemetry.trace.set_tracer_provider``), read when spans start.
        capture_content: put prompt and answer text on the spans (``input.value``,
            ``output.value``, ``gen_ai.input.messages``, ``gen_ai.output.messages``). Off by
            default: the text may hold personal data.

    Without OpenTelemetry installed the telemetry is disabled (:attr:`enabled` is False) and
    emits nothing; passing a ``tracer_provider`` then raises :class:`ConfigurationError`.
    """

    def __init__(self, tracer_provider: Any = None, *, capture_content: bool = False) -> None:
        self.capture_content = capture_content
        try:
            from opentelemetry import context, trace
        except ImportError:
            if tracer_provider is not None:
                msg = "tracer_provider= needs OpenTelemetry: pip install 'logtoku-guard[otel]' (opentelemetry-api)"
                raise ConfigurationError(msg) from None
            self._trace: Any = None
            self._context: Any = None
            self._tracer: Any = None
            return
        self._trace = trace
        self._context = context
        self._tracer = trace.get_tracer(INSTRUMENTATION_NAME, tracer_provider=tracer_provider)

    @classmethod
    def disabled(cls) -> GuardTelemetry:
        """Telemetry that emits nothing, even with OpenTelemetry installed."""
        telemetry = cls.__new__(cls)
        telemetry.capture_content = False
        telemetry._trace = telemetry._context = telemetry._tracer = None
        return telemetry

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start_run(self, guard: Guarded, question: Sequence[ChatMessage] | str | None = None) -> RunSpan:
        """Start the GUARDRAIL span of one question to ``guard`` (child of the current span, if any)."""
        if self._tracer is None:
            return RunSpan(None)
        backend, policy = guard.backend, guard.policy
        attributes: dict[str, Any] = {
            "openinference.span.kind": "GUARDRAIL",
            "gen_ai.operation.name": "apply_guardrail",
            "gen_ai.request.model": backend.model_name,
            "logtoku.policy.name": policy.name,
            "logtoku.policy.version": policy.version,
            "logtoku.k": backend.k,
        }
        if self.capture_content and question is not None:
            turns = [question] if isinstance(question, str) else [m.content for m in question if m.role == "user"]
            if turns:
                attributes["input.value"] = turns[-1]
        span = self._tracer.start_span("apply_guardrail logtoku", attributes=attributes)
        return RunSpan(self, span, guard)

    # -- the OpenTelemetry calls (modules imported once, in __init__) --------------------------------
    def start_span(self, name: str, parent: Any, attributes: dict[str, Any]) -> Any:
        return self._tracer.start_span(name, context=parent, attributes=attributes)

    def context_of(self, span: Any) -> Any:
        return self._trace.set_span_in_context(span)

    def attach(self, span: Any) -> Any:
        return self._context.attach(self._trace.set_span_in_context(span))

    def detach(self, token: Any) -> None:
        self._context.detach(token)

    def set_error(self, span: Any, description: str) -> None:
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, description))
