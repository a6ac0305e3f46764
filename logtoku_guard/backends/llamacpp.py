"""llama.cpp backend: LogTokU on GGUF models at llama.cpp speed (the ``llamacpp`` extra).

:class:`LlamaCppBackend` runs a GGUF file with llama.cpp (llama-cpp-python's bindings of its C
API, :mod:`~logtoku_guard.backends.llamacpp_model`) and scores every token from the raw logits
llama.cpp computes (``llama_get_logits_ith`` after each decode: no softmax, no sampler in
between). Requests go through the same :class:`~logtoku_guard.backends.batching.Batcher` as the
transformers backend; its worker runs a
:class:`~logtoku_guard.backends.llamacpp_loop.LlamaDecodeLoop`, where every batch row is one
llama.cpp sequence of a shared KV cache (continuous batching: rows join and leave between
steps). Token scores come from the same
:class:`~logtoku_guard.backends.recorder.StepRecorder` (top-K, AU/EU, log-probability,
entropy, stop strings, streaming), and the question's own tokens are scored from the prefill's
logits (:mod:`~logtoku_guard.backends.prompt_scoring`).

Prompts are rendered with the GGUF's own chat template the way transformers renders it, so the
model sees the same text under both backends. The numbers differ a little from the
transformers backend's (llama.cpp computes with the quantised weights, transformers with their
float32 de-quantisation): each backend has its own model name, hence its own calibration profile.

Importing this module does not import llama_cpp: constructing the backend does, and raises
:class:`~logtoku_guard.errors.MissingDependencyError` naming the extra when it is missing. Before
that, the first backend of a process checks in a child process that the installed build decodes
on this CPU (:mod:`~logtoku_guard.backends.llamacpp_check`, remembered per build and model): a build
for instructions the machine cannot run raises :class:`~logtoku_guard.errors.BackendError`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from logtoku_guard.backends.batched import BatchedBackend, fit_new_tokens
from logtoku_guard.backends.batching import DEFAULT_MAX_BATCH, Batcher, Job, PreparedRow
from logtoku_guard.backends.chunked_prefill import (
    DEFAULT_PREFILL_BUDGET_S,
    DEFAULT_PREFILL_CHUNK,
    PrefillCost,
    check_prefill_budget,
    check_prefill_chunk,
)
from logtoku_guard.backends.embedded import (
    EMBEDDED_ALIASES,
    EMBEDDED_MODEL,
    embedded_llama_gguf,
    llama_model_name,
    llama_weights,
)
from logtoku_guard.backends.llamacpp_check import resolve_gguf
from logtoku_guard.backends.packaged_models import PACKAGED_MODELS, packaged_stop
from logtoku_guard.backends.prompt_scoring import question_span
from logtoku_guard.backends.quiet import is_verbose
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
    from logtoku_guard.tools.grammar import GrammarEngine

__all__ = ["BACKEND_SUFFIX", "DEFAULT_N_CTX", "LlamaCppBackend", "llamacpp_model_name", "resolve_gguf"]


BACKEND_SUFFIX = "@llamacpp"
"""Appended to the model's name (``smollm2-135m-instruct@llamacpp``): profiles and guards are per backend."""
DEFAULT_N_CTX = 4096
"""KV-cache cells shared by the rows of a batch (22.5 KiB each for the embedded model: 90 MiB)."""


def llamacpp_model_name(model: str | os.PathLike[str] | None, weights: str | None = None) -> str:
    """The name :class:`LlamaCppBackend` records for ``model`` (``weights``: the embedded model's, None for
    :func:`~logtoku_guard.backends.embedded.llama_weights`'s default), found without loading, converting or
    assembling any file: what names its profiles, its guard and the evaluation's generation caches.

    The embedded model says its weights (``smollm2-135m-instruct-f16@llamacpp``; the shipped Q4_1 file keeps
    the plain name), a packaged model is named by its file (``gemma-3-270m-q4_k_m@llamacpp``, as the same file
    passed by path), a path by its file's stem."""
    if model is None or (isinstance(model, str) and model in EMBEDDED_ALIASES):
        return llama_model_name(llama_weights(weights)) + BACKEND_SUFFIX
    if isinstance(model, str) and model in PACKAGED_MODELS:
        file = PACKAGED_MODELS[model].file
        stem = Path(file).stem if file else resolve_gguf(model)[1]  # a record without its file name: the package says
        return stem + BACKEND_SUFFIX
    return Path(model).expanduser().stem + BACKEND_SUFFIX


def default_n_threads(n_threads: int | None) -> int:
    """``n_threads``, else ``$LOGTOKU_GUARD_THREADS``, else 1 on a machine of 2 CPUs or fewer, half the CPUs (up to 8) above.

    ggml's threads wait for each other by spinning: beside one other busy process on 2 CPUs, a
    second thread halved the answer's speed (0.47x) where alone it gained 1.42x
    (``benchmarks/bench_llamacpp_cpu.py --part threads``), so a small shared machine gets one
    thread, and a larger one leaves half its CPUs to the rest (the transformers backend's rule).
    """
    if n_threads is None:
        env = os.environ.get("LOGTOKU_GUARD_THREADS", "").strip()
        if env:
            try:
                n_threads = int(env)
            except ValueError:
                msg = f"$LOGTOKU_GUARD_THREADS must be a whole number of threads, got {env!r}"
                raise ConfigurationError(msg) from None
            if n_threads == 0:
                n_threads = None
    if n_threads is None:
        cpus = os.cpu_count() or 1
        return 1 if cpus <= 2 else min(8, cpus // 2)
    if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
        msg = f"n_threads must be a whole number >= 1, got {n_threads!r}"
        raise ConfigurationError(msg)
    return n_threads


class LlamaCppBackend(BatchedBackend):
    """A GGUF model run by llama.cpp, scored with LogTokU on every generated token.

    Args:
        model: ``"embedded"`` (or ``None``, ``"smollm2-135m-instruct"``) for the embedded
            SmolLM2-135M-Instruct GGUF, or the path of a ``.gguf`` file.
        n_threads: CPU threads (default: ``$LOGTOKU_GUARD_THREADS``, else 1 on 2 CPUs or fewer, half the CPUs up to 8 above).
        n_ctx: KV-cache cells shared by the concurrent rows; one request (prompt plus its
            ``max_new_tokens``) must fit, and rows join a running batch while the cells they
            may need are free.
        k: top-K logits per token (``2 <= k <= vocab``); the paper uses 2.
        evidence: ``"clamped"`` (default) or ``"raw"`` (reference reproduction, may give NaN).
        top_n: number of least reliable tokens averaged into the response reliability.
        max_logprobs: raw top logits kept per token for OpenAI-style ``top_logprobs`` (at least K).
        max_batch: most rows decoded together (llama.cpp sequences); 1 runs requests one at a time.
        prefill_chunk: prompt tokens a longer prompt is fed at a time (fewer deeper), so that it cannot
            stall the requests decoding beside it (:mod:`logtoku_guard.backends.chunked_prefill`;
            default 256); 0 feeds every prompt whole at once.
        prefill_budget_s: 0 (the default) feeds a longer prompt one chunk of ``prefill_chunk``
            tokens (fewer deeper) a step; a number of seconds feeds it in small pieces, as many a
            step as fit that time by what the pieces before cost
            (:class:`~logtoku_guard.backends.chunked_prefill.BudgetedPrefill`), so a short request
            beside it waits about that long rather than a whole chunk deep in the prompt, at the
            price of a slower long prompt and more rounding in its prompt scores
            (:data:`~logtoku_guard.backends.chunked_prefill.DEFAULT_PREFILL_BUDGET_S` says how much).
            It applies when ``concurrent_prefill`` is off.
        concurrent_prefill: a prompt longer than ``prefill_chunk`` is prefilled on a second llama.cpp
            context on the same weights, by a thread of its own, while the requests beside it go on
            decoding, then its KV cells are copied into the batch's context (exact:
            :class:`~logtoku_guard.backends.llamacpp_loop.SideFill`). None (default): on, unless
            ``prefill_budget_s`` is given; False feeds it in the decoding loop, a chunk (or a budget)
            at a time, taking turns with the decoding rows. The second context is opened on the first
            long prompt and costs a KV cache of ``n_ctx`` cells (``benchmarks/bench_fairness.py``).
        weights: the embedded model's weights (:data:`~logtoku_guard.backends.embedded.LLAMA_WEIGHTS`;
            default ``$LOGTOKU_GUARD_LLAMACPP_WEIGHTS``, else
            :data:`~logtoku_guard.backends.embedded.DEFAULT_LLAMA_WEIGHTS`, ``"f16"``): ``"q4_1"`` the
            shipped file, ``"q8_0"`` or ``"f16"`` a copy converted once into the cache
            (:func:`~logtoku_guard.backends.embedded.embedded_llama_gguf`), each a model of its own name
            (``smollm2-135m-instruct-f16@llamacpp``; the shipped file keeps the plain name) with its own
            profile and guard. Only for the embedded model.
        flash_attn: llama.cpp's flash attention: None (default) leaves the choice to llama.cpp (on, for a
            CPU), False turns it off, True on. Off suits long prompts: 7,000 tokens deep a decoding step took
            0.43x the time and a prompt piece 0.38x, for 0-4% slower steps in a short context
            (``benchmarks/bench_llamacpp.py --parts flash_attn``); but a row decoded beside others then
            differs from its answer alone by up to ~0.05 in a logit on the Q4_1 weights (bit for bit with it
            on), so it is not the default. The logits differ from the default's by float rounding only.
        cache_dir: where a converted copy is kept (default: the library's cache folder).
        progress: told, in words, when the embedded model is converted (first use of a weight type only).
        model_name: the name recorded on generations and used to find profiles (default: the
            model's name followed by ``@llamacpp``).
        verbose: let llama.cpp print its log (None: ``$LOGTOKU_GUARD_VERBOSE``, default off).
    """

    provider: ClassVar[str | None] = "llama.cpp"
    """The ``gen_ai.provider.name`` of this backend's spans."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        n_threads: int | None = None,
        n_ctx: int = DEFAULT_N_CTX,
        k: int = DEFAULT_K,
        evidence: EvidenceMode = "clamped",
        top_n: int = DEFAULT_TOP_N,
        max_logprobs: int = 20,
        max_batch: int = DEFAULT_MAX_BATCH,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        prefill_budget_s: float = DEFAULT_PREFILL_BUDGET_S,
        concurrent_prefill: bool | None = None,
        model_name: str | None = None,
        verbose: bool | None = None,
        weights: str | None = None,
        flash_attn: bool | None = None,
        cache_dir: str | Path | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        from logtoku_guard.backends.llamacpp_check import ensure_decodes
        from logtoku_guard.backends.llamacpp_model import LlamaModel, LlamaTokenizer, import_llama_cpp

        validate_k(k)
        self._evidence = validate_evidence(evidence)
        self._top_n = validate_top_n(top_n)
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 16:
            msg = f"n_ctx must be a whole number of KV-cache cells >= 16, got {n_ctx!r}"
            raise ConfigurationError(msg)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            msg = f"max_batch must be a whole number >= 1, got {max_batch!r}"
            raise ConfigurationError(msg)
        if isinstance(max_logprobs, bool) or not isinstance(max_logprobs, int) or max_logprobs < 0:
            msg = f"max_logprobs must be a non-negative integer (raw top logits kept per token), got {max_logprobs!r}"
            raise ConfigurationError(msg)
        self._n_threads = default_n_threads(n_threads)
        self._prefill_chunk = check_prefill_chunk(prefill_chunk)
        self._prefill_budget_s = check_prefill_budget(prefill_budget_s)
        if concurrent_prefill is not None and not isinstance(concurrent_prefill, bool):
            msg = f"concurrent_prefill must be True, False or None (None: on unless budgeted), got {concurrent_prefill!r}"
            raise ConfigurationError(msg)
        if concurrent_prefill and self._prefill_budget_s is not None:
            msg = (
                f"prefill_budget_s={prefill_budget_s!r} shares the decoding loop's time with a long prompt, "
                "and concurrent_prefill=True prefills it beside the loop: pass one of them"
            )
            raise ConfigurationError(msg)
        self._concurrent_prefill = self._prefill_budget_s is None if concurrent_prefill is None else concurrent_prefill
        self._prefill_cost = PrefillCost()  # what a prompt token costs here, learnt across batches
        path, default_name = resolve_gguf(model)
        if default_name == EMBEDDED_MODEL:
            path = embedded_llama_gguf(llama_weights(weights), cache_dir, progress)
        elif weights is not None:
            msg = f"weights={weights!r} converts the embedded model only; {str(model)!r} runs as its file is"
            raise ConfigurationError(msg)
        # Before llama.cpp's libraries enter this process: a build this CPU cannot run is a
        # BackendError naming the signal and the rebuild, not the end of the process (llamacpp_check).
        ensure_decodes(path, n_threads=self._n_threads)
        import_llama_cpp(is_verbose(verbose))
        self._model = LlamaModel(
            path, n_ctx=n_ctx, n_seq=2 * max_batch, n_threads=self._n_threads, flash_attn=flash_attn, verbose=is_verbose(verbose)
        )
        self._tokenizer = LlamaTokenizer(self._model)
        vocab = self._model.n_vocab
        self._k = validate_k(k, vocab)
        self._max_logprobs = max(min(max_logprobs, vocab), self._k)
        self._name = model_name or llamacpp_model_name(model, weights)
        self._path = path
        self.model_stop = packaged_stop(path)  # a packaged base model ends its answers at its stops
        self._template = self._model.metadata("tokenizer.chat_template")
        self._special = {
            name: text
            for name, token in (("bos_token", self._tokenizer.bos_token_id), ("eos_token", self._tokenizer.eos_token_id))
            if (text := self._tokenizer.token_text(token)) is not None
        }
        self._eos_ids = self._tokenizer.eog_ids or frozenset({self._tokenizer.eos_token_id})
        self._lock = threading.Lock()  # the context is used by one decode loop at a time
        # No waiting for companions: a request arriving later joins the running batch at the next step
        # (each row is prefilled alone anyway), so a window would only delay every request.
        self._batcher = Batcher(self._generate_jobs, max_batch=max_batch, window_s=0.0, name="logtoku-llamacpp")
        self.score_prompt = True  # score the question's tokens at prefill (Generation.prompt_scores)
        self._grammars: GrammarEngine | None = None
        self._grammars_lock = threading.Lock()

    _stream_thread = "logtoku-llamacpp-generate"

    # -- properties -------------------------------------------------------------------
    constrained_decoding = True
    """This backend honours ``DecodingOptions.constraint`` (grammar masks, the ``tools`` extra)."""

    honours_logit_params = True
    """This backend applies ``logit_bias`` and the penalties (:func:`~logtoku_guard.backends.processors.penalise_row`)."""

    def grammar_engine(self) -> GrammarEngine:
        """The vocabulary's grammar engine for constrained decoding (built on first use)."""
        with self._grammars_lock:
            if self._grammars is None:
                from logtoku_guard.tools.grammar import GrammarEngine

                self._grammars = GrammarEngine.from_llama(self._model, self._eos_ids)
            return self._grammars

    @property
    def context_window(self) -> int:
        """Tokens one request may use (prompt plus answer): the KV cache's size."""
        return self._model.n_ctx

    @property
    def vocab_size(self) -> int:
        return self._model.n_vocab

    @property
    def prefill_chunk(self) -> int | None:
        """Prompt tokens a long prompt is fed at a time (None: prompts are fed whole)."""
        return self._prefill_chunk

    @property
    def prefill_budget_s(self) -> float | None:
        """Seconds a step may spend feeding a long prompt (None: one fixed chunk a step)."""
        return self._prefill_budget_s

    @property
    def concurrent_prefill(self) -> bool:
        """Whether a long prompt is prefilled on a second context beside the decoding rows."""
        return self._concurrent_prefill and self._prefill_chunk is not None

    @property
    def n_threads(self) -> int:
        return self._n_threads

    @property
    def model_path(self) -> Path:
        return self._path

    # -- public API -------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text))

    def close(self) -> None:
        """Finish queued requests, then free the llama.cpp context and model."""
        self._batcher.close()
        with self._lock:
            self._model.close()

    # -- internals --------------------------------------------------------------------
    def _render(self, messages: list[ChatMessage]) -> str:
        from logtoku_guard.backends.llamacpp_model import render_chat

        if self._template:
            return render_chat(self._template, [{"role": m.role, "content": m.content} for m in messages], self._special)
        if len(messages) == 1:
            return messages[0].content
        return "\n".join(f"{m.role}: {m.content}" for m in messages) + "\nassistant:"

    def _prepare(self, messages: list[ChatMessage], options: DecodingOptions) -> PreparedRow:
        """Render and tokenize one prompt in the caller's thread; check it fits the context."""
        from logtoku_guard.backends.prompt_text import prompt_parts

        tok = self._tokenizer

        def control_text(content: str) -> str | None:
            ids = tok.encode(content)
            plain = tok.encode(content, special=False)
            return (
                None if ids == plain else next((tok.piece(i).decode("utf-8", "replace") for i in ids if i not in plain), content)
            )

        # Only the template's markup is parsed for control tokens; the messages' text is text.
        parts = prompt_parts(self._render, messages, control_text)
        text = "".join(p for p, _ in parts)
        ids = [t for part, is_content in parts for t in tok.encode(part, special=not is_content)]
        if not ids:
            msg = "the rendered prompt has no tokens; pass a non-empty question"
            raise ConfigurationError(msg)
        offsets = self._tokenizer.offsets(text, ids)
        bos = self._tokenizer.bos_token_id
        if self._tokenizer.add_bos and ids[0] != bos:  # the model expects BOS first and its template wrote none
            ids, offsets = [bos, *ids], [(0, 0), *offsets]
        span = question_span(text, question_of(messages), offsets, [1] * len(ids))
        limit = fit_new_tokens(len(ids), options.max_new_tokens, self._model.n_ctx)
        grammar = self.grammar_engine().start(options.constraint) if options.constraint is not None else None
        return PreparedRow(messages, ids, limit, span, self.score_prompt, grammar)

    def _generate_jobs(self, jobs: list[Job]) -> None:
        """Run ``jobs`` as one continuous batch (the batcher's worker thread)."""
        from logtoku_guard.backends.llamacpp_loop import LlamaDecodeLoop

        scoring = Scoring(self._k, self._evidence, self._max_logprobs, self._eos_ids)
        self._run_loop(jobs, scoring, LlamaDecodeLoop)

    def _run_loop(self, jobs: list[Job], scoring: Scoring, loop_class: Any) -> None:
        with self._lock:
            if self._model.ctx is None:
                msg = "this LlamaCppBackend was closed; create a new one"
                raise ConfigurationError(msg)
            loop = loop_class(
                self._model,
                self._tokenizer,
                scoring,
                jobs[0].options,
                self._batcher.take_joiners,
                self._generation,
                2 * self._batcher.max_batch,  # as many again for ended rows whose cells are not freed yet
                self._prefill_chunk,
                prefill_budget_s=self._prefill_budget_s,
                prefill_cost=self._prefill_cost,
                concurrent=self.concurrent_prefill,
            )
            loop.run(jobs)
