"""The backend protocol: where raw top-K logits come from.

A backend turns a prompt into a :class:`~logtoku_guard.types.Generation` whose every token
carries its raw top-K logits and AU/EU. Three calls: ``generate`` (one prompt), ``stream``
(one prompt, each token as soon as it is generated) and ``batch`` (several prompts), and
four read-only properties saying how it scores: ``model_name``, ``k``, ``evidence`` and
``top_n`` (each equal to the same field of every generation it returns).

Implementations share :class:`ScoringIdentity` (the four properties, validated once) and are
built by name through :mod:`logtoku_guard.backends.registry` (``transformers``, ``llamacpp``,
``openai``; :class:`~logtoku_guard.backends.fake.ScriptedBackend` is built directly, for tests).
Each names its ``provider`` (the ``gen_ai.provider.name`` of its spans): :func:`provider_of`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar, Protocol, runtime_checkable

from logtoku_guard.errors import UsageError
from logtoku_guard.scoring.uncertainty import EvidenceMode, validate_evidence, validate_k, validate_top_n
from logtoku_guard.types import DecodingOptions, Generation, Prompt, TokenScore


@runtime_checkable
class Backend(Protocol):
    """What the guard needs from a model: three calls and four properties.

    A runtime-checkable protocol: ``isinstance(x, Backend)`` checks that every member exists.
    """

    @property
    def model_name(self) -> str:
        """The model's name, as recorded on each generation (``Generation.model``) and used to
        find its calibration profile."""
        ...

    @property
    def k(self) -> int:
        """How many raw top logits are scored per token (``2 <= k <= vocab``; the paper uses 2)."""
        ...

    @property
    def evidence(self) -> EvidenceMode:
        """``"clamped"`` (evidence ``max(z, 0)``, the default) or ``"raw"`` (the reference
        code's raw logits: AU may be NaN or -inf, see README "Evidence modes")."""
        ...

    @property
    def top_n(self) -> int:
        """How many least reliable tokens are averaged into the response reliability."""
        ...

    def generate(self, prompt: Prompt, options: DecodingOptions | None = None) -> Generation: ...

    def stream(self, prompt: Prompt, options: DecodingOptions | None = None) -> TokenStream: ...

    def batch(self, prompts: Sequence[Prompt], options: DecodingOptions | None = None) -> list[Generation]: ...


class ScoringIdentity:
    """The four properties every backend shares, validated once: a base for implementations.

    ``provider``: who runs the model, as OpenTelemetry's ``gen_ai.provider.name`` names it (a class
    attribute each implementation sets; read with :func:`provider_of`).
    """

    provider: ClassVar[str | None] = None
    _name: str
    _k: int
    _evidence: EvidenceMode
    _top_n: int

    def _identify(self, model_name: str, k: int, evidence: str, top_n: int, *, vocab_size: int | None = None) -> None:
        """Set (and check) the model's name, K, evidence mode and top-N."""
        self._evidence = validate_evidence(evidence)
        self._top_n = validate_top_n(top_n)
        self._k = validate_k(k, vocab_size)
        self._name = model_name

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def k(self) -> int:
        return self._k

    @property
    def evidence(self) -> EvidenceMode:
        return self._evidence

    @property
    def top_n(self) -> int:
        return self._top_n


def provider_of(backend: object) -> str | None:
    """``backend``'s provider (``ScoringIdentity.provider``; a wrapper forwards its inner backend's), or None."""
    provider = getattr(backend, "provider", None)
    return provider if isinstance(provider, str) else None


class TokenStream:
    """Tokens of one generation as they are produced; :attr:`generation` once exhausted.

    Iterate to receive :class:`TokenScore` objects, each with its own AU/EU. ``close()``
    stops generation early (the result then has ``finish_reason == "cancelled"``). Use it as
    a context manager so an abandoned stream never leaves a generation running.

    An abandoned stream stops generating on its own: when the stream is garbage-collected,
    and when an iterator over it is dropped half-read (a ``break`` out of ``for token in
    stream``; its tokens cannot be read any more). Tokens already produced stay in
    :attr:`generation`.
    """

    def __init__(
        self,
        tokens: Iterator[TokenScore],
        result: Callable[[], Generation],  # blocks until generation has ended
        cancel: Callable[[], None] | None = None,
    ) -> None:
        self._tokens = tokens
        self._result = result
        self._cancel = cancel
        self._generation: Generation | None = None
        self._lock = threading.Lock()
        # Garbage-collected unfinished: stop generating. Detached once the stream is closed or ends, so a
        # generation that failed is not cancelled again (and its error raised again) at interpreter exit.
        self._finalizer = weakref.finalize(self, cancel) if cancel is not None else None

    def __iter__(self) -> Iterator[TokenScore]:
        try:
            yield from self._tokens
        except GeneratorExit:  # the iterator was dropped half-read: nobody can read the rest
            if self._cancel is not None:
                self._cancel()
            raise
        self._finish()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop generating; tokens already produced stay in :attr:`generation`."""
        if self._finalizer is not None:
            self._finalizer.detach()
        with self._lock:
            if self._generation is not None:
                return
            if self._cancel is not None:
                self._cancel()
        self._finish()

    def _finish(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        with self._lock:
            if self._generation is None:
                self._generation = self._result()

    @property
    def generation(self) -> Generation:
        """The finished :class:`Generation` (iterate the stream or ``close()`` it first)."""
        if self._generation is None:
            msg = "the stream is not finished: iterate it to the end or call close() before reading .generation"
            raise UsageError(msg)
        return self._generation
