"""Hugging Face transformers backend: raw top-K logits captured inside ``generate``.

:class:`TransformersBackend` renders the prompt (chat template), runs ``model.generate`` with
a :class:`~logtoku_guard.backends.recorder.StepRecorder` as forward hook and stopping
criterion (raw top-K logits read before any logits processor, tokens scored, detokenized
and streamed one step at a time) and, for dynamic decoding, a
:class:`~logtoku_guard.backends.processors.DynamicTemperatureLogitsWarper`. Models are loaded
by :mod:`logtoku_guard.backends.loading` (local files only).

Modules of this backend: ``transformers`` (this one: the backend class), ``recorder`` (step
capture, scoring, stop strings), ``detokenizer`` (incremental detokenization),
``processors`` (dynamic temperature), ``loading`` (local folder / .gguf / cached hub id /
embedded default).
"""

from __future__ import annotations

import copy
import gc
import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.base import TokenStream
from logtoku_guard.backends.loading import DTYPES, load_model
from logtoku_guard.backends.processors import DynamicTemperatureLogitsWarper
from logtoku_guard.backends.prompt_capture import PromptCapture, question_span
from logtoku_guard.backends.recorder import StepRecorder
from logtoku_guard.embedded import ProgressCallback
from logtoku_guard.errors import ConfigurationError, PromptTooLongError
from logtoku_guard.types import (
    ChatMessage,
    DecodingOptions,
    Generation,
    Prompt,
    Timings,
    TokenScore,
    to_messages,
)
from logtoku_guard.uncertainty import (
    DEFAULT_K,
    DEFAULT_TOP_N,
    EvidenceMode,
    validate_evidence,
    validate_k,
    validate_top_n,
)

if TYPE_CHECKING:
    import torch

__all__ = ["NoChatTemplateWarning", "TransformersBackend"]

logger = logging.getLogger(__name__)


class NoChatTemplateWarning(UserWarning):
    """The tokenizer has no chat template: turns are sent as a plain prompt."""


class TransformersBackend:
    """A local causal LM scored with LogTokU on every generated token.

    Args:
        model: ``None``/``"smollm2-135m-instruct"`` for the embedded default model, a local
            transformers folder, a ``.gguf`` file, or a Hugging Face model id that is
            already in the local hub cache (nothing is ever downloaded).
        k: top-K logits per token (``2 <= k <= vocab``); the paper uses 2.
        evidence: ``"clamped"`` (default) or ``"raw"`` (reference reproduction, may give NaN).
        top_n: number of least reliable tokens averaged into the response reliability.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``... or ``"auto"`` (CUDA when available).
        dtype: ``"auto"`` (float32 on CPU, bfloat16 on CUDA), ``"float32"``, ``"bfloat16"``,
            ``"float16"``. Scores are always computed in float32.
        cache_dir: where the embedded model is converted (see :mod:`logtoku_guard.embedded`).
        progress: called with a short message at each slow loading stage.
        model_obj, tokenizer: an already loaded model and tokenizer (then ``model`` only
            names it).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        k: int = DEFAULT_K,
        evidence: EvidenceMode = "clamped",
        top_n: int = DEFAULT_TOP_N,
        device: str = "auto",
        dtype: str = "auto",
        cache_dir: str | Path | None = None,
        progress: ProgressCallback | None = None,
        model_obj: Any = None,
        tokenizer: Any = None,
    ) -> None:
        validate_k(k)
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
            self._model, self._tokenizer, self._name = load_model(model, device, dtype, cache_dir, progress)
        self._model.eval()
        vocab = int(self._model.get_output_embeddings().weight.shape[0])
        self._k = validate_k(k, vocab)
        self._vocab_size = vocab
        if self._tokenizer.pad_token_id is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token
        self._tokenizer.padding_side = "left"
        self._eos_ids = _eos_ids(self._model, self._tokenizer)
        self._lock = threading.Lock()
        self.score_prompt = True
        """Score the question's tokens at the prefill pass (``Generation.prompt_scores``)."""
        self._warned_template = False

    # -- properties -------------------------------------------------------------------
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
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def device(self) -> torch.device:
        return self._model.device

    # -- public API -------------------------------------------------------------------
    def render(self, prompt: Prompt, system: str | None = None) -> str:
        """The exact text fed to the model (chat template applied)."""
        return self._render(to_messages(prompt, system))

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, prompt: Prompt, options: DecodingOptions | None = None, *, system: str | None = None) -> Generation:
        """Generate one answer with every token scored."""
        return self._run([prompt], options or DecodingOptions(), system)[0]

    def batch(
        self, prompts: Sequence[Prompt], options: DecodingOptions | None = None, *, system: str | None = None
    ) -> list[Generation]:
        """Generate several answers in one left-padded batch."""
        if isinstance(prompts, str) or not prompts:
            msg = f"batch() takes a non-empty list of prompts, got {prompts!r}; use generate() for one prompt"
            raise ConfigurationError(msg)
        return self._run(list(prompts), options or DecodingOptions(), system)

    def stream(self, prompt: Prompt, options: DecodingOptions | None = None, *, system: str | None = None) -> TokenStream:
        """Yield each token with its AU/EU as soon as it is generated.

        Generation runs in a worker thread; errors are re-raised in the consumer. With stop
        strings, a token is held back while it could still be the start of a stop string.
        A stream that is dropped unfinished (garbage-collected, or its iterator abandoned
        half-read) stops generating and frees the model for the next call.
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

        thread = threading.Thread(target=work, name="logtoku-generate", daemon=True)
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

    # -- internals --------------------------------------------------------------------
    def _render(self, messages: list[ChatMessage]) -> str:
        tok = self._tokenizer
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

    def _acquire_model(self) -> None:
        """Take the model lock; when it is busy, first collect garbage so that an abandoned stream
        caught in a reference cycle is finalised (which cancels its generation) instead of
        generating to the end while this call waits."""
        if self._lock.acquire(blocking=False):
            return
        gc.collect()
        self._lock.acquire()

    def _run(
        self,
        prompts: list[Any],
        options: DecodingOptions,
        system: str | None,
        on_token: Callable[[int, TokenScore], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> list[Generation]:
        import torch

        message_lists = [to_messages(p, system) for p in prompts]
        texts = [self._render(m) for m in message_lists]
        has_template = bool(getattr(self._tokenizer, "chat_template", None))
        enc = self._tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not has_template)
        prompt_capture = self._prompt_capture(enc, texts, message_lists)
        lengths = enc["attention_mask"].sum(dim=1).tolist()
        ctx = self.context_window
        max_new = options.max_new_tokens
        if ctx is not None:
            longest = max(lengths)
            if longest >= ctx:
                raise PromptTooLongError(int(longest), ctx)
            if longest + max_new > ctx:
                logger.warning(
                    "max_new_tokens=%d does not fit after a %d-token prompt in a %d-token context; generating at most %d",
                    max_new,
                    longest,
                    ctx,
                    ctx - longest,
                )
                max_new = ctx - longest
        gen_cfg = copy.deepcopy(self._model.generation_config)
        settings: dict[str, Any] = {
            "max_new_tokens": max_new,
            "pad_token_id": self._tokenizer.pad_token_id,
            "eos_token_id": sorted(self._eos_ids) or None,
            "return_dict_in_generate": False,
            "output_scores": False,
            "output_logits": False,
        }
        if options.sampling:
            temperature = 1.0 if options.dynamic is not None else float(options.temperature)
            settings.update(do_sample=True, temperature=temperature, top_p=float(options.top_p), top_k=0)
        else:
            settings.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        gen_cfg.update(**settings)

        recorder = StepRecorder(
            k=self._k,
            evidence=self._evidence,
            tokenizer=self._tokenizer,
            rows=len(texts),
            stop=options.stop,
            eos_ids=self._eos_ids,
            on_token=on_token,
            cancel=cancel,
        )
        processors = []
        if options.dynamic is not None:
            processors.append(DynamicTemperatureLogitsWarper(options.dynamic, recorder.current_eu, recorder.record_temperatures))

        self._acquire_model()
        try:
            if options.seed is not None:
                torch.manual_seed(options.seed)
                if torch.cuda.is_available():
                    torch.cuda.manual_seed_all(options.seed)
            handle = self._model.register_forward_hook(recorder.hook)
            if prompt_capture is not None:
                prompt_handle = self._model.get_decoder().register_forward_hook(prompt_capture.hook)
            start = time.perf_counter()
            recorder.start = start
            try:
                with torch.inference_mode():
                    self._model.generate(
                        **enc.to(self._model.device),
                        generation_config=gen_cfg,
                        logits_processor=processors or None,
                        stopping_criteria=[recorder],
                    )
            finally:
                handle.remove()
                if prompt_capture is not None:
                    prompt_handle.remove()
            total = time.perf_counter() - start
        finally:
            self._lock.release()
        out = []
        for row, (msgs, n_prompt) in enumerate(zip(message_lists, lengths)):
            state = recorder.finish_row(row)
            n = len(state.tokens)
            decode_s = total - (recorder.first_token_s or 0.0)
            out.append(
                Generation(
                    model=self._name,
                    prompt=_question(msgs),
                    text="".join(t.text for t in state.tokens),
                    tokens=tuple(state.tokens),
                    finish_reason=state.finish_reason or ("cancelled" if cancel is not None and cancel.is_set() else "length"),
                    k=self._k,
                    evidence=self._evidence,
                    top_n=self._top_n,
                    prompt_tokens=int(n_prompt),
                    stop_sequence=state.stop_sequence,
                    timings=Timings(
                        total_s=total,
                        first_token_s=recorder.first_token_s,
                        tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else None,
                    ),
                    prompt_scores=prompt_capture.scores[row] if prompt_capture is not None else (),
                )
            )
        return out

    def _prompt_capture(self, enc: Any, texts: list[str], message_lists: list[list[ChatMessage]]) -> PromptCapture | None:
        """The prefill hook scoring each row's question tokens (None: no fast tokenizer offsets
        or no decoder module to hook; the generations then have no prompt scores)."""
        if not self.score_prompt or not getattr(self._tokenizer, "is_fast", False):
            return None
        if not callable(getattr(self._model, "get_decoder", None)) or self._model.get_decoder() is None:
            return None
        has_template = bool(getattr(self._tokenizer, "chat_template", None))
        offsets = self._tokenizer(texts, padding=True, add_special_tokens=not has_template, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        spans = [
            question_span(text, _question(msgs), offs, mask)
            for text, msgs, offs, mask in zip(texts, message_lists, offsets, enc["attention_mask"].tolist())
        ]
        head = self._model.get_output_embeddings()
        return PromptCapture(head, self._model.config, enc["input_ids"], spans, self._k, self._evidence)


def _question(messages: list[ChatMessage]) -> str:
    users = [m.content for m in messages if m.role == "user"]
    return users[-1] if users else messages[-1].content


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
