"""The serving objects of one app, built once when the app is built and kept on its state.

:class:`Serving` holds what every request reads (the settings, the :class:`~logtoku_guard.server.engine.Engine`
with the guard built at start, the request limits with the backend's K, the served names, the
token decoder, the metrics); :func:`create_app` puts it on ``app.state.serving`` and the routes
(module-level functions, :mod:`logtoku_guard.server.routes`) read it with :func:`serving_of`.
:func:`error_response` and :func:`library_error` turn a refusal into OpenAI's error body.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from logtoku_guard.errors import AuditStoreError, ConfigurationError, LogTokUError
from logtoku_guard.server import wire
from logtoku_guard.server.limits import calibrated_max_tokens
from logtoku_guard.server.metrics import Tally, require_metrics_extra

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend
    from logtoku_guard.server.engine import Engine
    from logtoku_guard.server.metrics import ServerMetrics
    from logtoku_guard.server.settings import ServerSettings

__all__ = ["Serving", "error_response", "library_error", "serving_of"]

logger = logging.getLogger("logtoku_guard.server")


@dataclass(frozen=True)
class Serving:
    """What every request of one app reads, built once (:meth:`build`)."""

    settings: ServerSettings
    engine: Engine
    limits: wire.Limits
    """The settings' limits with the backend's K, the alternatives it keeps per token and the answer
    length the served profile's guard was fitted on (the ``max_tokens`` of a request that sends none)."""
    names: tuple[str, ...]
    """The names clients may send as ``model``; the first is the one responses carry."""
    text_of: wire.TokenText
    metrics: ServerMetrics | None

    @classmethod
    def build(cls, settings: ServerSettings, engine: Engine) -> Serving:
        backend = engine.backend
        given = settings.limits
        profile = engine.profile if engine.profile is not None else settings.profile
        limits = wire.Limits(
            given.max_tokens,
            given.default_max_tokens,
            int(backend.k),
            max_top_logprobs=wire.kept_alternatives(backend),
            logprobs_mode=given.logprobs_mode,
            default_temperature=given.default_temperature,
            # an omitted max_tokens: the length the served profile's guard was fitted on
            calibrated_max_tokens=calibrated_max_tokens(None if profile == "auto" else profile),
        )
        metrics = None
        if settings.metrics != "off":
            require_metrics_extra()
            from logtoku_guard.server.metrics import ServerMetrics

            metrics = ServerMetrics(engine.runner, backend)
        names = settings.model_names or (backend.model_name,)
        return cls(settings, engine, limits, tuple(names), token_text(backend), metrics)

    @property
    def backend(self) -> Backend:
        return self.engine.backend

    @property
    def model(self) -> str:
        """The name responses carry."""
        return self.names[0]

    def tally(self, endpoint: str, started: float) -> Tally:
        """Where one request's outcome is counted (nothing without metrics)."""
        return Tally(self.metrics, endpoint, started)


def serving_of(request: Any) -> Serving:
    """The serving objects of the app ``request`` came to."""
    serving: Serving = request.app.state.serving
    return serving


def error_response(exc: wire.RequestError, extra: Any = None) -> Any:
    """``exc`` as OpenAI's error body with its status."""
    from starlette.responses import JSONResponse

    return JSONResponse(exc.body(extra), status_code=exc.status)


def library_error(exc: LogTokUError) -> Any:
    """A library error raised while answering, as the client gets it: the guard's ``raise`` a 422 with
    the decision (never the draft); a bad prompt or option a 400; the audit store a 503 (its address
    goes to the log only); anything else a 500."""
    from logtoku_guard.decision.results import GuardRejectedError
    from logtoku_guard.wire.payloads import served_decision_payload

    if isinstance(exc, GuardRejectedError):  # the draft is withheld: the decision only, without it
        extra = {"logtoku_guard": dict(served_decision_payload(exc.result))}
        return error_response(wire.RequestError(422, str(exc), kind="guard_rejected"), extra)
    if isinstance(exc, ConfigurationError):  # bad prompt, prompt too long, bad options
        return error_response(wire.RequestError(400, str(exc)))
    if isinstance(exc, AuditStoreError):  # the database's address goes to the log only
        logger.error("the audit store failed: %s", exc)
        return error_response(wire.RequestError(503, "the audit store is unreachable; try again later"))
    logger.error("generation failed: %s", exc, exc_info=exc)
    return error_response(wire.RequestError(500, f"generation failed: {exc.__class__.__name__}: {exc}"))


def token_text(backend: Backend) -> wire.TokenText:
    """``decode([id])`` with the backend's tokenizer, or vLLM's ``token_id:<id>`` without one."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return lambda i: f"token_id:{i}"

    @lru_cache(maxsize=65536)
    def text_of(i: int) -> str:
        return str(tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False))

    return text_of
