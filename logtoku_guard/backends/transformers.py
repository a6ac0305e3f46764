"""Hugging Face transformers backend: raw top-K logits captured at every decoding step.

:class:`TransformersBackend` renders the prompt (chat template) in the caller's thread, hands
it to its :class:`~logtoku_guard.backends.batching.Batcher` (concurrent calls from threads,
asyncio tasks or the server share one running batch: continuous batching, each returns as
its own row ends), whose worker thread runs a
:class:`~logtoku_guard.backends.decode_loop.DecodeLoop` (with ``threads`` torch threads): the
model's forward passes with a :class:`~logtoku_guard.backends.recorder.StepRecorder` (raw
top-K logits read before any logits processor, tokens scored, detokenized and streamed one
step at a time) and, for dynamic decoding, a
:class:`~logtoku_guard.backends.processors.DynamicTemperatureLogitsWarper`. Models are loaded
by :mod:`logtoku_guard.backends.loading` (local files only).

Modules of this backend: ``transformers`` (this one: the backend class), ``batching`` (the
batcher), ``decode_loop`` (the running batch: rows join and leave between steps),
``recorder`` (step capture, scoring, stop strings), ``detokenizer`` (incremental detokenization),
``processors`` (the generation config's logits processors, dynamic temperature), ``loading``
(local folder / .gguf / cached hub id / embedded default), ``prompt_scoring`` (the question's
tokens scored at the prefill pass: ``Generation.prompt_scores``), ``hf_compat`` (the KV cache
argument, whose name changed within transformers 5.x), ``quiet`` (no transformers progress bars
or warnings around our calls unless ``verbose``).
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from logtoku_guard.backends.batched import BatchedBackend, fit_new_tokens
from logtoku_guard.backends.batching import DEFAULT_MAX_BATCH, Batcher, Job, PreparedRow
from logtoku_guard.backends.chunked_prefill import DEFAULT_PREFILL_CHUNK, check_prefill_chunk
from logtoku_guard.backends.decode_loop import DecodeLoop
from logtoku_guard.backends.embedded import ProgressCallback
from logtoku_guard.backends.loading import DTYPES, load_model
from logtoku_guard.backends.packaged_models import packaged_stop
from logtoku_guard.backends.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from logtoku_guard.backends.processors import check_generation_config
from logtoku_guard.backends.prompt_scoring import question_span
from logtoku_guard.backends.quiet import is_verbose, quiet_transformers
from logtoku_guard.backends.recorder import Scoring
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.uncertainty import (
    DEFAULT_K,
    DEFAULT_TOP_N,
    EvidenceMode,
    validate_evidence,
    validate_k,
    validate_top_n,
)
from logtoku_guard.types import ChatMessage, DecodingOptions, question_of

if TYPE_CHECKING:
    import torch

    from logtoku_guard.tools.grammar import GrammarEngine

__all__ = ["THREADS_ENV", "NoChatTemplateWarning", "TransformersBackend", "default_threads"]


THREADS_ENV = "LOGTOKU_GUARD_THREADS"


def default_threads(threads: int | None = None) -> int | None:
    """torch intra-op threads for generation: ``threads``, else ``$LOGTOKU_GUARD_THREADS``, else a default.

    ``0`` (argument or variable) leaves torch's own setting alone (None is returned). The
    default is 1 on a machine with at most 2 CPUs, where torch's default of one spinning
    OpenMP thread per core made a synchronous generation 4-7x slower than the same one in a
    worker thread as soon as another process was busy (see benchmarks/bench_threads.py), and
    half the CPUs (at most 8) elsewhere, leaving room for other processes.
    """
    if threads is None:
        env = os.environ.get(THREADS_ENV, "").strip()
        if env:
            try:
                threads = int(env)
            except ValueError:
                msg = f"${THREADS_ENV} must be a whole number of threads, got {env!r}"
                raise ConfigurationError(msg) from None
    if threads is None:
        cpus = os.cpu_count() or 1
        return 1 if cpus <= 2 else min(8, cpus // 2)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        msg = f"threads must be a whole number >= 0 (0: torch's default), got {threads!r}"
        raise ConfigurationError(msg)
    return threads or None


class NoChatTemplateWarning(UserWarning):
    """The tokenizer has no chat template: turns are sent as a plain prompt."""


class TransformersBackend(BatchedBackend):
    """A local causal LM scored with LogTokU on every generated token.

    Args:
        model: ``None``/``"smollm2-135m-instruct"`` for the embedded default model, a local
            transformers folder, a ``.gguf`` file, or a Hugging Face model id that is
            already in the local hub cache (nothing is ever downloaded).
        k: top-K logits per token (``2 <= k <= vocab``); the paper uses 2.
        max_logprobs: raw top logits kept per token for OpenAI-style ``top_logprobs``
            (``TokenScore.alt_logits``; default 20, vLLM's ``--max-logprobs``); AU/EU and the
            profile use only K.
        evidence: ``"clamped"`` (default) or ``"raw"`` (reference reproduction, may give NaN).
        top_n: number of least reliable tokens averaged into the response reliability.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``... or ``"auto"`` (CUDA when available).
        dtype: ``"auto"`` (float32 on CPU, bfloat16 on CUDA), ``"float32"``, ``"bfloat16"``,
            ``"float16"``. Scores are always computed in float32.
        cache_dir: where the embedded model is converted (see :mod:`logtoku_guard.backends.embedded`).
        progress: called with a short message at each slow loading stage.
        model_obj, tokenizer: an already loaded model and tokenizer (then ``model`` only
            names it).
        max_batch: most rows generated together: concurrent calls (threads, asyncio tasks
            via worker threads, the server) share one running batch of up to this many rows,
            joining and leaving it between steps (:mod:`logtoku_guard.backends.batching`);
            1 runs them one at a time.
        threads: torch intra-op threads while generating (:func:`default_threads`: this,
            else ``$LOGTOKU_GUARD_THREADS``, else 1 on <= 2 CPUs, half the CPUs up to 8
            otherwise; 0 keeps torch's setting). torch's setting is process-wide.
        prefix_cache_mb: MiB of prompt-prefix KV caches kept (the chat template's opening and
            the system prompt, prefilled once and reused by every prompt that begins with them:
            :mod:`logtoku_guard.backends.prefix_cache`); 0 prefills every prompt whole.
        prefill_chunk: prompt tokens a longer prompt is fed at a time (fewer deeper), so that it cannot
            stall the requests decoding beside it (:mod:`logtoku_guard.backends.chunked_prefill`;
            default 256); 0 prefills every prompt whole at once.
        concurrent_prefill: True (default) feeds such a prompt's chunks by a thread of its own while
            the batch goes on decoding, so the decoding rows keep a core instead of waiting for each
            chunk: a one-row request is answered whole there by a decode loop of its own, the rows of a
            request of several join the batch once fed (:mod:`~logtoku_guard.backends.staged`);
            False feeds them in the decoding loop, taking turns with the decoding rows. Either way the
            chunks and their logits are the same.
        verbose: let transformers print its progress bars and warnings while loading and
            generating (None: ``$LOGTOKU_GUARD_VERBOSE``, default off;
            :mod:`logtoku_guard.backends.quiet`).
    """

    provider: ClassVar[str | None] = "transformers"
    """The ``gen_ai.provider.name`` of this backend's spans."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        k: int = DEFAULT_K,
        evidence: EvidenceMode = "clamped",
        top_n: int = DEFAULT_TOP_N,
        max_logprobs: int = 20,
        device: str = "auto",
        dtype: str = "auto",
        cache_dir: str | Path | None = None,
        progress: ProgressCallback | None = None,
        model_obj: Any = None,
        tokenizer: Any = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        threads: int | None = None,
        prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        concurrent_prefill: bool = True,
        verbose: bool | None = None,
    ) -> None:
        validate_k(k)
        is_verbose(verbose)  # a bad value or $LOGTOKU_GUARD_VERBOSE fails here, not at the first generation
        self._verbose = verbose
        if isinstance(prefix_cache_mb, bool) or not isinstance(prefix_cache_mb, int) or prefix_cache_mb < 0:
            msg = f"prefix_cache_mb must be a whole number of MiB >= 0 (0 disables prefix caching), got {prefix_cache_mb!r}"
            raise ConfigurationError(msg)
        self._prefix_cache = PrefixCache(prefix_cache_mb * 2**20) if prefix_cache_mb else None
        self._prefill_chunk = check_prefill_chunk(prefill_chunk)
        if not isinstance(concurrent_prefill, bool):
            msg = f"concurrent_prefill must be True or False, got {concurrent_prefill!r}"
            raise ConfigurationError(msg)
        self._concurrent_prefill = concurrent_prefill
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            msg = f"max_batch must be a whole number >= 1, got {max_batch!r}"
            raise ConfigurationError(msg)
        self._threads = default_threads(threads)
        self._evidence = validate_evidence(evidence)
        self._top_n = validate_top_n(top_n)
        if dtype not in DTYPES:
            msg = f"dtype must be one of {DTYPES}, got {dtype!r}"
            raise ConfigurationError(msg)
        if (model_obj is None) != (tokenizer is None):
            msg = "pass both model_obj and tokenizer (an already loaded pair), or neither"
            raise ConfigurationError(msg)
        if model_obj is not None:
            self._model, self._tokenizer = model_obj, tokenizer
            self._name = str(model) if model is not None else getattr(model_obj, "name_or_path", "model")
        else:
            self._model, self._tokenizer, self._name = load_model(model, device, dtype, cache_dir, progress, verbose)
        if isinstance(model, (str, os.PathLike)):  # a packaged base model's file ends its answers at its stops
            self.model_stop = packaged_stop(model)
        self._model.eval()
        check_generation_config(self._model.generation_config)  # refused at load, not at the first generation
        vocab = int(self._model.get_output_embeddings().weight.shape[0])
        self._k = validate_k(k, vocab)
        if isinstance(max_logprobs, bool) or not isinstance(max_logprobs, int) or max_logprobs < 0:
            msg = f"max_logprobs must be a non-negative integer (raw top logits kept per token), got {max_logprobs!r}"
            raise ConfigurationError(msg)
        self._max_logprobs = max(min(max_logprobs, vocab), self._k)
        self._vocab_size = vocab
        if self._tokenizer.pad_token_id is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token
        self._tokenizer.padding_side = "left"
        # Prompts are tokenised on a copy of our own, one call at a time: a fast tokenizer rewrites
        # its settings (split_special_tokens, truncation, padding) on its shared Rust object at every
        # call, so a caller of ``self.tokenizer`` in another thread (an integration's token count,
        # a batch padded for scoring) could otherwise switch them between our calls and turn a
        # user's ``<|im_end|>`` into the control token (a forged turn), or the markup into text.
        self._prompt_tokenizer = _own_copy(self._tokenizer)
        self._prompt_lock = threading.Lock()
        self._eos_ids = _eos_ids(self._model, self._tokenizer)
        self._batcher = Batcher(self._generate_jobs, max_batch=max_batch)
        self.score_prompt = True  # score the question's tokens at prefill (Generation.prompt_scores); read per request
        self._warned_template = False
        self._grammars: GrammarEngine | None = None
        self._grammars_lock = threading.Lock()

    # -- properties -------------------------------------------------------------------
    @property
    def context_window(self) -> int | None:
        cfg = self._model.config
        for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
            value = getattr(cfg, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def model(self) -> Any:
        """The underlying transformers model (read-only use)."""
        return self._model

    @property
    def device(self) -> torch.device:
        return self._model.device

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The store of prompt-prefix KV caches (None: disabled with ``prefix_cache_mb=0``)."""
        return self._prefix_cache

    @property
    def concurrent_prefill(self) -> bool:
        """Whether a long prompt's chunks are fed by a thread of their own beside the decoding rows."""
        return self._concurrent_prefill and self._prefill_chunk is not None

    @property
    def prefill_chunk(self) -> int | None:
        """Prompt tokens a long prompt is fed at a time (None: prompts are prefilled whole)."""
        return self._prefill_chunk

    @property
    def threads(self) -> int | None:
        """torch intra-op threads set while generating (None: torch's own setting)."""
        return self._threads

    constrained_decoding = True
    """This backend honours ``DecodingOptions.constraint`` (grammar masks, the ``tools`` extra)."""

    honours_logit_params = True
    """This backend applies ``logit_bias`` and the penalties (:mod:`~logtoku_guard.backends.processors`)."""

    def grammar_engine(self) -> GrammarEngine:
        """The tokenizer's grammar engine for constrained decoding (built on first use, ~0.3 s)."""
        with self._grammars_lock:
            if self._grammars is None:
                from logtoku_guard.tools.grammar import GrammarEngine

                self._grammars = GrammarEngine.from_hf(self._tokenizer, self._vocab_size, self._eos_ids)
            return self._grammars

    # -- public API -------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        with self._prompt_lock:
            return len(self._prompt_tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- internals --------------------------------------------------------------------
    def _render(self, messages: list[ChatMessage]) -> str:
        tok = self._prompt_tokenizer
        turns = [{"role": m.role, "content": m.content} for m in messages]
        if getattr(tok, "chat_template", None):
            return str(tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False))
        if not self._warned_template:
            warnings.warn(
                f"the tokenizer of {self._name!r} has no chat template; sending the turns as a plain prompt",
                NoChatTemplateWarning,
                stacklevel=4,
            )
            self._warned_template = True
        if len(messages) == 1:
            return messages[0].content
        return "\n".join(f"{m.role}: {m.content}" for m in messages) + "\nassistant:"

    def _prepare(self, messages: list[ChatMessage], options: DecodingOptions) -> PreparedRow:
        """Render and tokenize one prompt in the caller's thread; check it fits the context."""
        text, ids, offsets = self._tokenize_prompt(messages)
        span = question_span(text, question_of(messages), offsets, [1] * len(ids)) if offsets is not None else None
        limit = fit_new_tokens(len(ids), options.max_new_tokens, self.context_window)
        grammar = self.grammar_engine().start(options.constraint) if options.constraint is not None else None
        return PreparedRow(messages, ids, limit, span, self.score_prompt, grammar)

    def _tokenize_prompt(self, messages: list[ChatMessage]) -> tuple[str, list[int], list[tuple[int, int]] | None]:
        """:meth:`_tokenize_prompt_unlocked` under the backend's prompt lock: it switches
        ``split_special_tokens`` between the markup and the messages' text on the backend's own
        copy of the tokenizer, so two callers' threads tokenising at once must not interleave (a
        joined row then saw other ids)."""
        with self._prompt_lock:
            return self._tokenize_prompt_unlocked(messages)

    def _tokenize_prompt_unlocked(self, messages: list[ChatMessage]) -> tuple[str, list[int], list[tuple[int, int]] | None]:
        """The rendered prompt, its token ids and (fast tokenizers) each token's character offsets.

        Only the chat template's markup is parsed for special tokens; the messages' text is
        tokenised with ``split_special_tokens`` (:func:`~logtoku_guard.backends.prompt_text.prompt_parts`).
        """
        from logtoku_guard.backends.prompt_text import prompt_parts

        tok = self._prompt_tokenizer
        fast = bool(getattr(tok, "is_fast", False))
        if not getattr(tok, "chat_template", None):  # a plain prompt: all of it is the messages' text
            text = self._render(messages)
            enc = tok(text, add_special_tokens=True, split_special_tokens=True, return_offsets_mapping=fast)
            return text, list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]] if fast else None

        def control_text(content: str) -> str | None:
            ids = tok(content, add_special_tokens=False)["input_ids"]
            if ids == tok(content, add_special_tokens=False, split_special_tokens=True)["input_ids"]:
                return None
            special = set(tok.all_special_ids) | {i for t, i in tok.get_added_vocab().items() if t in content}
            return next((tok.convert_ids_to_tokens(i) for i in ids if i in special), content)

        parts = prompt_parts(self._render, messages, control_text)
        text = "".join(p for p, _ in parts)
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        start = 0
        for part, is_content in parts:
            enc = tok(part, add_special_tokens=False, split_special_tokens=is_content, return_offsets_mapping=fast)
            ids.extend(enc["input_ids"])
            if fast:
                offsets.extend((start + a, start + b) for a, b in enc["offset_mapping"])
            start += len(part)
        return text, ids, offsets if fast else None

    def _generate_jobs(self, jobs: list[Job]) -> None:
        """Run ``jobs`` (compatible options) as one continuous batch; each job completes as its rows end."""
        import torch

        if self._threads is not None and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        scoring = Scoring(self._k, self._evidence, self._max_logprobs, self._eos_ids)
        with quiet_transformers(self._verbose):
            loop = DecodeLoop(
                self._model,
                self._tokenizer,
                scoring,
                jobs[0].options,
                self._batcher.take_joiners,
                self._generation,
                self._prefix_cache,
                self._prefill_chunk,
                concurrent=self._concurrent_prefill,
            )
            loop.run(jobs)


def _own_copy(tokenizer: Any) -> Any:
    """The tokenizer the backend tokenises prompts with: a copy of a fast tokenizer (its per-call
    settings live on one Rust object that every caller of the original rewrites), the tokenizer
    itself otherwise (a Python tokenizer reads ``split_special_tokens`` from each call's arguments)."""
    if not getattr(tokenizer, "is_fast", False):
        return tokenizer
    import copy

    return copy.deepcopy(tokenizer)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
