"""One place that builds a backend from a name and settings.

``create_backend("transformers" | "llamacpp" | "openai", BackendSettings(...))`` is what the CLI
(``ask``, ``score``, ``calibrate``, ``serve``), the integrations and the harness call. A backend is
added by registering a factory, nothing else::

    from logtoku_guard.backends.registry import BackendSettings, register_backend

    def build_mine(settings: BackendSettings) -> Backend:
        settings.refuse("mine", "device", "dtype")  # settings it cannot honour are errors, not ignored
        return MyBackend(settings.model, k=settings.k, evidence=settings.evidence, top_n=settings.top_n)

    register_backend("mine", build_mine)

Each backend module is imported only when its name is asked for: ``import logtoku_guard`` stays light.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.uncertainty import DEFAULT_K, DEFAULT_TOP_N

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend

__all__ = ["API_KEY_ENV", "BackendSettings", "backend_names", "create_backend", "register_backend"]

API_KEY_ENV = ("LOGTOKU_GUARD_REMOTE_API_KEY", "OPENAI_API_KEY")
"""Where the ``openai`` backend reads its key when none is given (the first one set)."""


@dataclass(frozen=True)
class BackendSettings:
    """Every setting a backend may take; None means "the backend's default".

    A factory reads the settings it honours and refuses (:meth:`refuse`) those it cannot, so a
    setting given to the wrong backend is an error naming it, never silently dropped. The batching
    settings given (``max_batch``, ``prefix_cache_mb``, ``prefill_chunk``) are checked here, once,
    when the settings are made: before any model loads (``serve`` makes them first).
    """

    model: str | None = None
    """The model: a Hugging Face name or folder (transformers), a .gguf file (llamacpp), the served
    name (openai; default: the one model the server lists). None: the embedded default model."""
    k: int = DEFAULT_K
    evidence: str = "clamped"
    top_n: int = DEFAULT_TOP_N
    device: str | None = None
    dtype: str | None = None
    cache_dir: Path | None = None
    max_batch: int | None = None
    threads: int | None = None
    prefix_cache_mb: int | None = None
    prefill_chunk: int | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float | None = None
    progress: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        given = self.given("max_batch", "prefix_cache_mb", "prefill_chunk")
        if "max_batch" in given and not _whole(self.max_batch, 1):
            msg = f"--max-batch must be at least 1, got {self.max_batch!r}"
            raise ConfigurationError(msg)
        if "prefix_cache_mb" in given and not _whole(self.prefix_cache_mb, 0):
            msg = f"--prefix-cache-mb must be >= 0 (0 disables prefix caching), got {self.prefix_cache_mb!r}"
            raise ConfigurationError(msg)
        if "prefill_chunk" in given and not (type(self.prefill_chunk) is int and self.prefill_chunk == 0):
            from logtoku_guard.backends.chunked_prefill import MIN_PREFILL_CHUNK

            if not _whole(self.prefill_chunk, MIN_PREFILL_CHUNK):
                msg = (
                    f"--prefill-chunk must be at least {MIN_PREFILL_CHUNK} tokens (0: prefill prompts whole), "
                    f"got {self.prefill_chunk!r}"
                )
                raise ConfigurationError(msg)

    def given(self, *names: str) -> dict[str, Any]:
        """The settings among ``names`` that were given (not None), by name."""
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def refuse(self, backend: str, *names: str) -> None:
        """Raise when a setting among ``names`` was given: ``backend`` cannot honour it."""
        given = sorted(self.given(*names))
        if given:
            options = ", ".join(f"{name}={getattr(self, name)!r}" for name in given)
            msg = f"the {backend} backend does not take {options}: leave {'it' if len(given) == 1 else 'them'} out"
            raise ConfigurationError(msg)


def _whole(value: object, least: int) -> bool:
    """``value`` is a whole number (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


Factory = Callable[[BackendSettings], "Backend"]
_FACTORIES: dict[str, Factory] = {}


def register_backend(name: str, factory: Factory, *, replace: bool = False) -> None:
    """Make ``create_backend(name, ...)`` call ``factory(settings)``."""
    if not isinstance(name, str) or (not name.isidentifier() and not name.replace("-", "_").isidentifier()):
        msg = f"a backend name is a short identifier such as 'transformers', got {name!r}"
        raise ConfigurationError(msg)
    if name in _FACTORIES and not replace:
        msg = f"a backend named {name!r} is registered already; pass replace=True to replace it"
        raise ConfigurationError(msg)
    _FACTORIES[name] = factory


def backend_names() -> tuple[str, ...]:
    """The registered backend names, in registration order (the built-in ones first)."""
    return tuple(_FACTORIES)


def create_backend(name: str, settings: BackendSettings | None = None, **overrides: Any) -> Backend:
    """The backend ``name`` built with ``settings`` (and ``overrides``: BackendSettings fields)."""
    factory = _FACTORIES.get(name)
    if factory is None:
        msg = f"unknown backend {name!r}; choose one of {', '.join(backend_names())}"
        raise ConfigurationError(msg)
    settings = settings or BackendSettings()
    if overrides:
        known = {f.name for f in fields(BackendSettings)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            msg = f"unknown backend setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            raise ConfigurationError(msg)
        settings = BackendSettings(**{**{f.name: getattr(settings, f.name) for f in fields(BackendSettings)}, **overrides})
    return factory(settings)


# -- the built-in backends ---------------------------------------------------------------------
def _transformers(settings: BackendSettings) -> Backend:
    settings.refuse("transformers", "base_url", "api_key", "timeout")
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend(
        settings.model,
        k=settings.k,
        evidence=settings.evidence,  # type: ignore[arg-type]  # validated by the backend
        top_n=settings.top_n,
        cache_dir=settings.cache_dir,
        progress=settings.progress,
        **settings.given("device", "dtype", "max_batch", "threads", "prefix_cache_mb", "prefill_chunk"),
    )


def _llamacpp(settings: BackendSettings) -> Backend:
    settings.refuse("llamacpp", "base_url", "api_key", "timeout", "prefix_cache_mb")
    wrong = [f"device={settings.device!r}"] if settings.device not in (None, "auto", "cpu") else []
    wrong += [f"dtype={settings.dtype!r}"] if settings.dtype not in (None, "auto") else []
    if wrong:
        msg = (
            f"{' and '.join(wrong)} apply to the transformers backend; llama.cpp runs the GGUF file's own weights "
            "on the CPU: leave them out with --backend llamacpp"
        )
        raise ConfigurationError(msg)
    from logtoku_guard.backends.llamacpp import LlamaCppBackend

    extra = settings.given("max_batch", "prefill_chunk")
    if settings.threads is not None:
        extra["n_threads"] = settings.threads
    return LlamaCppBackend(
        settings.model,
        k=settings.k,
        evidence=settings.evidence,  # type: ignore[arg-type]  # validated by the backend
        top_n=settings.top_n,
        cache_dir=settings.cache_dir,  # where the embedded model's converted weights are kept
        progress=settings.progress,
        **extra,
    )


def remote_api_key(environ: Mapping[str, str] | None = None) -> str | None:
    """The remote server's key from the environment (:data:`API_KEY_ENV`, the first one set), or None."""
    env = os.environ if environ is None else environ
    for name in API_KEY_ENV:
        value = env.get(name)
        if value:
            return value
    return None


def _openai(settings: BackendSettings) -> Backend:
    settings.refuse("openai", "device", "dtype", "max_batch", "threads", "prefix_cache_mb", "prefill_chunk")
    if settings.base_url is None:
        msg = "the openai backend needs the server's address: --base-url http://HOST:PORT/v1 (base_url=...)"
        raise ConfigurationError(msg)
    from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend, served_models

    api_key = settings.api_key if settings.api_key is not None else remote_api_key()
    model = settings.model
    if model is None:
        served = served_models(settings.base_url, api_key, timeout=settings.timeout or 30.0)
        if len(served) != 1:
            msg = (
                f"{settings.base_url} serves {len(served)} models ({', '.join(served[:10]) or 'none'}); "
                "name the one to use with --model"
            )
            raise ConfigurationError(msg)
        model = served[0]
    extra: dict[str, Any] = {"timeout": settings.timeout} if settings.timeout is not None else {}
    return OpenAICompatibleBackend(
        settings.base_url,
        model,
        api_key=api_key,
        k=settings.k,
        evidence=settings.evidence,  # type: ignore[arg-type]  # validated by the backend
        top_n=settings.top_n,
        **extra,
    )


register_backend("transformers", _transformers)
register_backend("llamacpp", _llamacpp)
register_backend("openai", _openai)
