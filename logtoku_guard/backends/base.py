"""The backend protocol: where raw top-K logits come from.

A backend turns a prompt into a :class:`~logtoku_guard.types.Generation` whose every token
carries its raw top-K logits and AU/EU. Three calls: ``generate`` (one prompt), ``stream``
(one prompt, each token as soon as it is generated) and ``batch`` (several prompts), and
four read-only properties saying how it scores: ``model_name``, ``k``, ``evidence`` and
``top_n`` (each equal to the same field of every generation it returns).

Implementations: :class:`~logtoku_guard.backends.transformers.TransformersBackend` (a local
model) and :class:`~logtoku_guard.backends.fake.ScriptedBackend` (scripted logits, for tests).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from logtoku_guard.errors import UsageError
from logtoku_guard.scoring.uncertainty import EvidenceMode
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
        if cancel is not None:
            weakref.finalize(self, cancel)  # garbage-collected unfinished: stop generating

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
        with self._lock:
            if self._generation is not None:
                return
            if self._cancel is not None:
                self._cancel()
        self._finish()

    def _finish(self) -> None:
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
