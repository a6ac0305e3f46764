"""What the two local backends share: the Backend protocol's calls over a continuous batcher.

:class:`BatchedBackend` holds the scoring properties, ``render``, ``generate``, ``batch`` and
``stream`` (each prompt prepared in the caller's thread, then one :class:`~logtoku_guard.backends.batching.Job`
of the batcher, which may add other requests' rows) and the conversion of a finished row into a
:class:`~logtoku_guard.types.Generation`. A subclass
(:class:`~logtoku_guard.backends.transformers.TransformersBackend`,
:class:`~logtoku_guard.backends.llamacpp.LlamaCppBackend`) sets the attributes below in its
``__init__`` and implements ``_render`` (messages to the model's text), ``_prepare`` (a prompt
to a tokenized row that fits the context) and the batcher's worker (its decode loop).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.base import ScoringIdentity, TokenStream
from logtoku_guard.errors import ConfigurationError, PromptTooLongError
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, Prompt, Timings, TokenScore, question_of, to_messages

if TYPE_CHECKING:
    from logtoku_guard.backends.batching import Batcher, PreparedRow

__all__ = ["BatchedBackend", "fit_new_tokens"]

logger = logging.getLogger(__name__)


def fit_new_tokens(n_prompt: int, max_new_tokens: int, context: int | None) -> int:
    """How many tokens a row may generate after an ``n_prompt``-token prompt in a ``context``-token
    window (None: unbounded): ``max_new_tokens``, cut (with a warning) to what fits; a prompt that
    fills the window is a :class:`~logtoku_guard.errors.PromptTooLongError`."""
    if context is None:
        return max_new_tokens
    if n_prompt >= context:
        raise PromptTooLongError(n_prompt, context)
    if n_prompt + max_new_tokens > context:
        logger.warning(
            "max_new_tokens=%d does not fit after a %d-token prompt in a %d-token context; generating at most %d",
            max_new_tokens,
            n_prompt,
            context,
            context - n_prompt,
        )
        return context - n_prompt
    return max_new_tokens


class BatchedBackend(ScoringIdentity):
    """The shared half of a local backend; see the module docstring."""

    _max_logprobs: int
    _tokenizer: Any
    _batcher: Batcher
    _stream_thread = "logtoku-generate"
    """The name of the thread that runs a stream's generation."""
    model_stop: tuple[str, ...] = ()
    """The model's own stop strings, added to every row beside the caller's ``stop`` (a packaged base
    model's :attr:`~logtoku_guard.backends.packaged_models.PackagedModel.stop`, looked for after the
    answer's leading whitespace: :mod:`~logtoku_guard.backends.stop_strings`); ``()`` (set it so to
    keep a base model's whole continuation): none."""

    # -- properties (model_name, k, evidence, top_n: ScoringIdentity) ---------------------
    @property
    def max_logprobs(self) -> int:
        """Raw top logits kept per token for ``top_logprobs`` (at least K)."""
        return self._max_logprobs

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_batch(self) -> int:
        return self._batcher.max_batch

    @property
    def requests_waiting(self) -> int:
        """Requests queued for the running batch (the server's queue-depth metric)."""
        return self._batcher.waiting

    @property
    def running_rows(self) -> int:
        """Rows being decoded in the running batch now (the server's batch-size metric)."""
        return self._batcher.running_rows

    # -- public API -------------------------------------------------------------------
    def render(self, prompt: Prompt, system: str | None = None) -> str:
        """The exact text fed to the model (chat template applied)."""
        return self._render(to_messages(prompt, system))

    def prompt_length(self, prompt: Prompt, *, system: str | None = None) -> int:
        """The tokens ``prompt`` takes as generation feeds it (rendered, tokenised); nothing is generated.
        Raises :class:`~logtoku_guard.errors.PromptTooLongError` when it fills the context window."""
        return len(self._prepare(to_messages(prompt, system), DecodingOptions(max_new_tokens=1)).ids)

    def generate(self, prompt: Prompt, options: DecodingOptions | None = None, *, system: str | None = None) -> Generation:
        """Generate one answer with every token scored."""
        return self._run([prompt], options or DecodingOptions(), system)[0]

    def batch(
        self, prompts: Sequence[Prompt], options: DecodingOptions | None = None, *, system: str | None = None
    ) -> list[Generation]:
        """Generate several answers as rows of one batch (other concurrent calls may join it)."""
        if isinstance(prompts, str) or not prompts:
            msg = f"batch() takes a non-empty list of prompts, got {prompts!r}; use generate() for one prompt"
            raise ConfigurationError(msg)
        return self._run(list(prompts), options or DecodingOptions(), system)

    def stream(self, prompt: Prompt, options: DecodingOptions | None = None, *, system: str | None = None) -> TokenStream:
        """Yield each token with its AU/EU as soon as it is generated.

        Generation runs in the batcher's worker thread (possibly in a batch with other
        requests); errors are re-raised in the consumer. With stop strings, a token is held
        back while it could still be the start of a stop string. ``close()``, or a stream that
        is dropped unfinished (garbage-collected, or its iterator abandoned half-read), ends its
        row after the current step and frees the model for the next call.
        """
        opts = options or DecodingOptions()
        messages = to_messages(prompt, system)  # validate in the caller's thread
        q: queue.Queue[tuple[str, Any]] = queue.Queue()
        cancel = threading.Event()
        results: list[Generation] = []
        errors: list[BaseException] = []

        def work() -> None:
            try:
                results.extend(self._run([messages], opts, None, on_token=lambda _row, t: q.put(("token", t)), cancel=cancel))
            except BaseException as exc:  # re-raised in the consumer thread
                errors.append(exc)
            finally:
                q.put(("end", None))

        thread = threading.Thread(target=work, name=self._stream_thread, daemon=True)
        thread.start()

        def tokens() -> Iterator[TokenScore]:
            while True:
                kind, item = q.get()
                if kind == "end":
                    break
                yield item
            thread.join()
            if errors:
                raise errors[0]

        def result() -> Generation:
            thread.join()
            if errors:
                raise errors[0]
            return results[0]

        return TokenStream(tokens(), result, cancel.set)

    # -- for the subclass and its decode loop -----------------------------------------------
    def _render(self, messages: list[ChatMessage]) -> str:
        raise NotImplementedError

    def _prepare(self, messages: list[ChatMessage], options: DecodingOptions) -> PreparedRow:
        raise NotImplementedError

    def _run(
        self,
        prompts: list[Any],
        options: DecodingOptions,
        system: str | None,
        on_token: Callable[[int, TokenScore], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> list[Generation]:
        """Generate ``prompts`` as one job of the batcher (which may add other requests' rows)."""
        from logtoku_guard.backends.batching import Job

        rows = [self._prepare(to_messages(p, system), options) for p in prompts]
        return self._batcher(Job(rows, options, on_token, cancel, model_stop=self.model_stop))

    def _generation(self, row: Any) -> Generation:
        """The finished ``row`` of a decode loop as a :class:`Generation` (timings from when it joined)."""
        state, job = row.state, row.job
        total = time.perf_counter() - row.start
        n = len(state.tokens)
        decode_s = total - (row.first_token_s or 0.0)
        cancelled = job.cancel is not None and job.cancel.is_set()
        return Generation(
            model=self._name,
            prompt=question_of(row.prepared.messages),
            text="".join(t.text for t in state.tokens),
            tokens=tuple(state.tokens),
            finish_reason=state.finish_reason or ("cancelled" if cancelled else "length"),
            k=self._k,
            evidence=self._evidence,
            top_n=self._top_n,
            prompt_tokens=len(row.prepared.ids),
            stop_sequence=state.stop_sequence,
            timings=Timings(
                total_s=total,
                first_token_s=row.first_token_s,
                tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else None,
            ),
            prompt_scores=row.prompt_scores,
        )
