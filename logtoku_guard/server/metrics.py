"""The server's Prometheus metrics (``GET /metrics``), named in vLLM's style (``logtoku:...``).

One :class:`ServerMetrics` per app, on its own :class:`prometheus_client.CollectorRegistry` (two
apps in one process, as in the tests, never share counters). What is measured:

==========================================  =============================================================
``logtoku:requests_total``                  answered requests by ``endpoint`` (chat, completions) and
                                            ``outcome`` (ok, client_error, guard_rejected, server_error,
                                            client_gone: the client left and its generation was stopped)
``logtoku:prompt_tokens_total``             prompt tokens of the answered requests
``logtoku:generation_tokens_total``         tokens the model generated, every guard attempt included
``logtoku:guard_decisions_total``           the guard's decisions by ``action`` and ``rule`` (``-``: none fired)
``logtoku:guard_score``                     histogram of the decisions' guard scores (defined ones)
``logtoku:response_max_eu``                 histogram of the answers' largest token EU
``logtoku:e2e_request_latency_seconds``     histogram of the time from request to the last byte's data
``logtoku:time_to_first_token_seconds``     histogram of the time to the first token (the generation's)
``logtoku:num_requests_running``            requests holding a generation slot now
``logtoku:num_requests_waiting``            requests queued for the running batch now
``logtoku:batch_rows``                      rows in the running batch now
==========================================  =============================================================

Labels take values from the server's own sets (endpoints, outcomes, the policy's actions and
rule names), never from a request, so a client cannot grow the series. ``prometheus-client``
comes with the ``serve`` extra.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import MissingDependencyError

__all__ = ["METRICS_MODES", "ServerMetrics", "Tally", "require_metrics_extra"]

METRICS_MODES = ("auth", "open", "off")
"""``GET /metrics`` behind the API key (default), open to anyone who reaches the port, or not served."""

_UNIT = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_LATENCY = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_TTFT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)


class ServerMetrics:
    """The metrics of one app; ``runner``/``backend`` feed the gauges when scraped."""

    def __init__(self, runner: Any, backend: Backend) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "logtoku:requests", "Answered requests by endpoint and outcome.", ["endpoint", "outcome"], registry=registry
        )
        self.prompt_tokens = Counter("logtoku:prompt_tokens", "Prompt tokens of answered requests.", registry=registry)
        self.generation_tokens = Counter(
            "logtoku:generation_tokens", "Tokens generated, every guard attempt included.", registry=registry
        )
        self.decisions = Counter(
            "logtoku:guard_decisions", "Guard decisions by action and rule.", ["action", "rule"], registry=registry
        )
        self.guard_score = Histogram("logtoku:guard_score", "Guard score of each decision.", buckets=_UNIT, registry=registry)
        self.max_eu = Histogram("logtoku:response_max_eu", "Largest token EU of each answer.", buckets=_UNIT, registry=registry)
        self.latency = Histogram(
            "logtoku:e2e_request_latency_seconds", "Request to response end.", buckets=_LATENCY, registry=registry
        )
        self.ttft = Histogram("logtoku:time_to_first_token_seconds", "Time to the first token.", buckets=_TTFT, registry=registry)
        running = Gauge("logtoku:num_requests_running", "Requests holding a generation slot.", registry=registry)
        waiting = Gauge("logtoku:num_requests_waiting", "Requests queued for the running batch.", registry=registry)
        rows = Gauge("logtoku:batch_rows", "Rows in the running batch.", registry=registry)
        running.set_function(lambda: float(getattr(runner, "busy", 0)))
        waiting.set_function(lambda: float(getattr(backend, "requests_waiting", 0)))
        rows.set_function(lambda: float(getattr(backend, "running_rows", 0)))

    def answered(self, endpoint: str, generation: Any, guard_result: Any, seconds: float) -> None:
        """Count one answered request: its tokens, the guard's decision and scores, its latency."""
        self.requests.labels(endpoint, "ok").inc()
        self.latency.observe(seconds)
        self.prompt_tokens.inc(generation.prompt_tokens)
        attempts = [a.generation for a in guard_result.attempts] if guard_result is not None else [generation]
        self.generation_tokens.inc(sum(len(g.tokens) for g in attempts))
        first = generation.timings.first_token_s if generation.timings is not None else None
        if first is not None and math.isfinite(first):
            self.ttft.observe(first)
        eus = [t.eu for t in generation.tokens if math.isfinite(t.eu)]
        if eus:
            self.max_eu.observe(max(eus))
        if guard_result is not None:
            self.decided(guard_result)

    def decided(self, guard_result: Any) -> None:
        decision = guard_result.decision
        self.decisions.labels(guard_result.action, decision.rule or "-").inc()
        score = decision.stats.guard_score
        if math.isfinite(score):
            self.guard_score.observe(score)

    def refused(self, endpoint: str, status: int, seconds: float, guard_result: Any = None) -> None:
        """Count a request answered with an error (``status``); a guard's ``raise`` is ``guard_rejected``."""
        if guard_result is not None:
            outcome = "guard_rejected"
        elif status == 499:  # nginx's code for a client that closed the request: its generation was stopped
            outcome = "client_gone"
        else:
            outcome = "client_error" if status < 500 else "server_error"
        self.requests.labels(endpoint, outcome).inc()
        self.latency.observe(seconds)
        if guard_result is not None:
            self.decided(guard_result)

    def exposition(self) -> tuple[bytes, str]:
        """The text to serve and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def require_metrics_extra() -> None:
    """Raise :class:`MissingDependencyError` unless prometheus-client is installed (``/metrics``)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        msg = "GET /metrics needs prometheus-client (the 'serve' extra): pip install 'logtoku-guard[serve]', or --metrics off"
        raise MissingDependencyError(msg) from exc


@dataclass(frozen=True)
class Tally:
    """Where one request's outcome is counted (nothing without metrics)."""

    metrics: Any
    endpoint: str
    started: float

    def answered(self, answer: Any) -> None:
        if self.metrics is not None:
            self.metrics.answered(self.endpoint, answer.generation, answer.guard_result, time.perf_counter() - self.started)

    def refused(self, status: int, guard_result: Any = None) -> None:
        if self.metrics is not None:
            self.metrics.refused(self.endpoint, status, time.perf_counter() - self.started, guard_result)
