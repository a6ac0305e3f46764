"""The server's settings, validated once: :class:`ServerSettings` feeds both ``logtoku-guard serve`` and the app.

Every check of a setting is made here, once, when the settings are built (``serve`` builds them
before it loads a model, so a bad setting fails at once): the address (a non-loopback host needs
``allow_remote``), the port, the shutdown grace, the connection limits and the process's
open-file limit, the API key, the ``/metrics`` mode, the request limits, and the guard's needs
(a ``--store`` needs a ``--policy``; a policy that can send answers or tool calls to human review
needs a store). The app (:func:`~logtoku_guard.server.app.create_app`) and the runner
(:func:`~logtoku_guard.server.run.run_server`) read them without checking them again.
"""

from __future__ import annotations

import ipaddress
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SkipValidation, ValidationError, model_validator

from logtoku_guard.audit.records import RecordSink
from logtoku_guard.calibration.profiles import ModelProfile
from logtoku_guard.decision.decider import require_review_store
from logtoku_guard.decision.policy import Policy
from logtoku_guard.errors import ConfigurationError, MissingDependencyError, short_repr
from logtoku_guard.server.connections import ConnectionLimits, connection_cap
from logtoku_guard.server.limits import Limits
from logtoku_guard.server.metrics import METRICS_MODES
from logtoku_guard.sockets import check_port

__all__ = [
    "ServerSettings",
    "check_api_key",
    "check_graceful_timeout",
    "check_host",
    "is_loopback",
    "require_serve_extra",
]

LOOPBACK_NAMES = ("localhost",)

_FLAGS = {
    "host": "--host",
    "port": "--port",
    "allow_remote": "--allow-remote",
    "graceful_timeout": "--graceful-timeout",
    "api_key": "--api-key",
    "max_body_bytes": "--max-body-bytes",
    "model_names": "--served-name",
    "metrics": "--metrics",
    "policy": "--policy",
    "profile": "--profile",
    "store": "--store",
}
"""Each field's ``serve`` option, named in a type error."""


REVIEW_QUEUE_NEEDED = (
    "a review queue: pass --store (a SQLite file or a postgresql:// URL; store= in Python) and decide "
    "with 'logtoku-guard review serve --store'"
)
"""What a policy that sends answers or tool calls to human review needs, in the server's words."""


class ServerSettings(BaseModel):
    """What the server serves and how, checked once (a bad value raises :class:`ConfigurationError`
    naming its ``serve`` option and the fix).

    - where: ``host`` (a non-loopback one needs ``allow_remote``), ``port``, ``graceful_timeout``
      (seconds for the requests in flight at shutdown), ``connections`` (read timeouts, the cap on
      open connections, checked here against the process's open-file limit);
    - access: ``api_key`` (None: open), ``metrics`` (``GET /metrics``: ``auth`` behind the key,
      ``open`` or ``off``);
    - requests: ``max_body_bytes``, ``limits`` (``max_tokens``, defaults, ``logprobs_mode``),
      ``model_names`` (what clients send as ``model``; default: the backend's name);
    - the guard: ``policy`` (a :class:`~logtoku_guard.decision.policy.Policy`; None: unguarded),
      ``profile`` (a ModelProfile, ``"auto"``: the model's saved or shipped one, or None),
      ``store`` (the audit store: a :class:`~logtoku_guard.audit.records.RecordSink`, or where
      ``serve`` opens one), ``cache_dir`` (where ``"auto"`` looks for saved profiles).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8000
    allow_remote: bool = False
    graceful_timeout: float = 30.0
    connections: ConnectionLimits = Field(default_factory=ConnectionLimits)
    api_key: str | None = None
    max_body_bytes: int = 1_000_000
    limits: Limits = Field(default_factory=Limits)
    model_names: tuple[str, ...] = ()
    metrics: str = "auth"
    """``GET /metrics`` (Prometheus): ``auth`` behind the API key like ``/v1``, ``open``, or ``off``."""
    policy: Policy | None = None
    profile: ModelProfile | Literal["auto"] | None = None
    store: Annotated[RecordSink | str | Path | None, SkipValidation] = None
    """The audit store (any :class:`RecordSink`: a protocol, not checked here), or where to open one (a
    SQLite file or a ``postgresql://`` URL; ``serve`` opens it before loading the model, else the app does)."""
    cache_dir: Path | None = None

    _connection_cap: int = PrivateAttr(default=0)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _configuration_error(exc) from None

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        check_host(self.host, self.allow_remote)
        check_port(self.port, allow_any=True)  # 0: any free port (the socket says which)
        check_graceful_timeout(self.graceful_timeout)
        check_api_key(self.api_key)
        if self.metrics not in METRICS_MODES:
            msg = f"--metrics must be one of {', '.join(METRICS_MODES)}, got {short_repr(self.metrics)}"
            raise ConfigurationError(msg)
        if self.max_body_bytes < 1:
            msg = f"--max-body-bytes must be a whole number of bytes >= 1, got {self.max_body_bytes}; the default is 1000000"
            raise ConfigurationError(msg)
        self._check_guard()
        self._connection_cap = connection_cap(self.connections.max_connections)  # the open-file limit, before any model loads
        return self

    def _check_guard(self) -> None:
        policy = self.policy
        if self.store is not None and policy is None:
            msg = "--store records the guard's decisions: give a --policy too (without one nothing is guarded or recorded)"
            raise ConfigurationError(msg)
        if policy is not None:
            require_review_store(
                policy,
                self.store,
                tool_calls=True,
                needs=REVIEW_QUEUE_NEEDED,
            )

    @property
    def max_connections(self) -> int:
        """The cap on open connections: ``connections.max_connections``, or what the open-file limit allows."""
        return self._connection_cap

    def with_values(self, **changes: Any) -> ServerSettings:
        """These settings with ``changes`` (fields given as None are left as they are), checked again."""
        given = {name: value for name, value in changes.items() if value is not None}
        return self if not given else ServerSettings(**{**dict(self), **given})


def _configuration_error(exc: ValidationError) -> ConfigurationError:
    """The settings' first error: the check's own :class:`ConfigurationError`, or one naming the option."""
    errors = exc.errors()
    for err in errors:
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, ConfigurationError):
            return cause
    err = errors[0]
    field = str(err["loc"][0]) if err["loc"] else ""
    where = _FLAGS.get(field, field or "the server settings")
    return ConfigurationError(f"{where}: {err['msg']} (got {short_repr(err.get('input'))})")


def check_api_key(key: str | None) -> str | None:
    """``key`` if clients can send it as ``Authorization: Bearer KEY`` (``None``: no key); raise otherwise.

    An empty key would let in any request with a bare ``Bearer`` header; a key with spaces or
    characters outside printable ASCII could never be matched from an HTTP header.
    """
    if key is None:
        return None
    if not key.strip():
        msg = (
            f"--api-key is empty ({key!r}): any request would pass with a bare 'Authorization: Bearer' header; "
            "pass a real key (e.g. from: python -c 'import secrets; print(secrets.token_urlsafe(32))'), "
            "or leave --api-key out to serve without one"
        )
        raise ConfigurationError(msg)
    if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
        msg = (
            "--api-key must be printable ASCII without spaces (clients send it in the header 'Authorization: Bearer KEY'); "
            "pass a key such as one from: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
        raise ConfigurationError(msg)
    return key


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool) -> str:
    """``host`` if it is a loopback address or ``allow_remote``; raise otherwise."""
    if not is_loopback(host) and not allow_remote:
        msg = (
            f"host {host!r} would expose the server beyond this machine; bind to 127.0.0.1 (the default), "
            "or pass --allow-remote (and set --api-key) to serve other machines"
        )
        raise ConfigurationError(msg)
    return host


def check_graceful_timeout(seconds: float) -> float:
    """``seconds`` if it is a finite number >= 0; raise otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (0 <= seconds < math.inf):
        msg = f"--graceful-timeout must be a finite number of seconds >= 0, got {seconds!r}; the default is 30"
        raise ConfigurationError(msg)
    return float(seconds)


def require_serve_extra() -> None:
    """Raise :class:`MissingDependencyError` unless FastAPI and uvicorn are installed."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        msg = f"the server needs the 'serve' extra ({exc.name} is missing): pip install 'logtoku-guard[serve]'"
        raise MissingDependencyError(msg) from exc
