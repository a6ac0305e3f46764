"""Hugging Face transformers backend: raw top-K logits captured inside ``generate``.

How the raw logits are captured: a forward hook on the model reads ``outputs.logits[:, -1]``
at every decoding step, *before* any logits processor (repetition penalty, temperature,
top-k/p...) touches them, and keeps only what LogTokU needs: the top-K values and ids, AU,
EU, the full-softmax entropy and its log-normaliser and, for one step only, the raw row
from which the chosen token's log-probability is read (its logit minus the normaliser). A
stopping criterion (called once per step, right after the token is chosen) pairs the chosen
token with that step's scores, detokenizes it (incrementally: a short window of ids, never
the whole answer), handles stop strings and streams the token out. Memory therefore grows
with steps x K, never with steps x vocabulary.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.base import TokenStream
from logtoku_guard.embedded import EMBEDDED_ALIASES, EMBEDDED_MODEL, ProgressCallback, ensure_embedded_model
from logtoku_guard.errors import (
    ConfigurationError,
    ModelLoadError,
    NonFiniteLogitsError,
    PromptTooLongError,
)
from logtoku_guard.types import (
    ChatMessage,
    DecodingOptions,
    FinishReason,
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
    logsumexp_entropy,
    logtoku,
    validate_evidence,
    validate_k,
    validate_top_n,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_DTYPES = ("auto", "float32", "bfloat16", "float16")


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
        if dtype not in _DTYPES:
            msg = f"dtype must be one of {_DTYPES}, got {dtype!r}"
            raise ConfigurationError(msg)
        if (model_obj is None) != (tokenizer is None):
            msg = "pass both model_obj and tokenizer (an already loaded pair), or neither"
            raise ConfigurationError(msg)
        if model_obj is not None:
            self._model, self._tokenizer = model_obj, tokenizer
            self._name = str(model) if model is not None else getattr(model_obj, "name_or_path", "model")
        else:
            self._model, self._tokenizer, self._name = _load(model, device, dtype, cache_dir, progress)
        self._model.eval()
        vocab = int(self._model.get_output_embeddings().weight.shape[0])
        self._k = validate_k(k, vocab)
        self._vocab_size = vocab
        if self._tokenizer.pad_token_id is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token
        self._tokenizer.padding_side = "left"
        self._eos_ids = _eos_ids(self._model, self._tokenizer)
        self._lock = threading.Lock()
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

        recorder = _StepRecorder(
            k=self._k,
            evidence=self._evidence,
            tokenizer=self._tokenizer,
            rows=len(texts),
            stop=options.stop,
            eos_ids=self._eos_ids,
            on_token=on_token,
            cancel=cancel,
            dynamic=options.dynamic,
        )
        processors = []
        if options.dynamic is not None:
            processors.append(_DynamicTemperatureProcessor(recorder, options.dynamic))

        with self._lock:
            if options.seed is not None:
                torch.manual_seed(options.seed)
                if torch.cuda.is_available():
                    torch.cuda.manual_seed_all(options.seed)
            handle = self._model.register_forward_hook(recorder.hook)
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
            total = time.perf_counter() - start
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
                )
            )
        return out


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


# -- per-step recording --------------------------------------------------------------------
@dataclass
class _Pending:
    """One decoding step's scores, waiting for the chosen token (all ``(B, ...)`` tensors)."""

    values: torch.Tensor
    ids: torch.Tensor
    au: torch.Tensor
    eu: torch.Tensor
    logits: torch.Tensor  # this step's raw row, kept only until the token is chosen
    lse: torch.Tensor
    entropy: torch.Tensor


_MAX_PENDING = 16
"""Tokens a row may hold back without new text before they are flushed as they decode.

A UTF-8 character spans at most 4 bytes, so byte-level tokens hold text back for at most 3
steps; only invalid UTF-8 or a long run of skipped special tokens reaches this bound, which
keeps the decoded window, hence each step's work, independent of the answer's length. The
flush renders incomplete bytes as U+FFFD: only a valid character whose bytes straddle it
(after 16 tokens of invalid UTF-8) could come out differently from a whole-answer decode.
"""


@dataclass
class _Detokenizer:
    """Incremental detokenization of one row: each token's text piece in bounded work per step.

    Decoding the whole answer at every step and diffing it with the previous text costs O(n)
    per step, O(n^2) per answer. As in transformers' ``TextStreamer`` and vLLM's detokenizer,
    only a window of ``ids`` is decoded: ``ids[prefix_offset:read_offset]`` is text already
    emitted, kept as context because a decoder's output depends on the neighbouring tokens
    (SentencePiece drops the leading space of the first token it decodes; byte-level BPE splits
    a character's UTF-8 bytes across tokens), and ``ids[read_offset:]`` is not emitted yet. The
    new piece is what decoding ``ids[prefix_offset:]`` adds to decoding
    ``ids[prefix_offset:read_offset]``; since a window always starts where a complete
    character ended, that is the text a whole-answer decode adds at this step.
    """

    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0

    def step(self, tokenizer: Any, token_id: int) -> str:
        """Append ``token_id`` and return the text it completes ("" while it completes none)."""
        self.ids.append(token_id)
        start, read = self.prefix_offset, self.read_offset
        prefix_text = _decode(tokenizer, self.ids[start:read]) if read > start else ""
        text = _decode(tokenizer, self.ids[start:])
        # A trailing U+FFFD is an incomplete UTF-8 character: its bytes come with a later token.
        complete = len(text) > len(prefix_text) and not text.endswith("\ufffd")
        if not complete and len(self.ids) - read <= _MAX_PENDING:
            return ""
        self.prefix_offset, self.read_offset = read, len(self.ids)
        # A decoder that rewrites earlier text: only what goes past the emitted text is new.
        return text[len(prefix_text) :]


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))


@dataclass
class _Row:
    """Decoding state of one batch row."""

    detokenizer: _Detokenizer = field(default_factory=_Detokenizer)
    held: list[TokenScore] = field(default_factory=list)
    tokens: list[TokenScore] = field(default_factory=list)
    done: bool = False
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None


class _StepRecorder:
    """Forward hook + stopping criterion: one record per row per step, no vocab-sized history."""

    def __init__(
        self,
        *,
        k: int,
        evidence: EvidenceMode,
        tokenizer: Any,
        rows: int,
        stop: tuple[str, ...],
        eos_ids: frozenset[int],
        on_token: Callable[[int, TokenScore], None] | None,
        cancel: threading.Event | None,
        dynamic: Any,
    ) -> None:
        self.k = k
        self.evidence = evidence
        self.tokenizer = tokenizer
        self.rows = [_Row() for _ in range(rows)]
        self.stop = stop
        self.eos_ids = eos_ids
        self.on_token = on_token
        self.cancel = cancel
        self.dynamic = dynamic
        self.pending: _Pending | None = None
        self.temperatures: torch.Tensor | None = None
        self.step = 0
        self.start = 0.0
        self.first_token_s: float | None = None

    # transformers calls this after every forward pass of the model (prefill and decode).
    def hook(self, module: Any, args: Any, output: Any) -> None:
        logits = output.logits[:, -1, :].float()
        values, ids = logits.topk(self.k, dim=-1)
        au, eu = logtoku(values, self.evidence)
        lse, entropy = logsumexp_entropy(logits)
        self.pending = _Pending(values, ids, au, eu, logits, lse, entropy)

    # StoppingCriteria protocol: called once per step, right after the token is chosen.
    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        import torch

        pending = self.pending
        if pending is None:
            msg = "internal error: a decoding step finished without a recorded forward pass"
            raise RuntimeError(msg)
        self.pending = None
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.start
        chosen = input_ids[:, -1]
        chosen_logit = pending.logits.gather(-1, chosen[:, None].to(pending.logits.device)).squeeze(-1)
        logprob = chosen_logit - pending.lse
        values = pending.values.tolist()
        top_ids = pending.ids.tolist()
        au = pending.au.tolist()
        eu = pending.eu.tolist()
        lp = logprob.tolist()
        ent = pending.entropy.tolist()
        temps = self.temperatures.tolist() if self.temperatures is not None else None
        chosen_ids = chosen.tolist()
        done = []
        for b, row in enumerate(self.rows):
            if row.done:
                done.append(True)
                continue
            token_id = int(chosen_ids[b])
            if token_id in self.eos_ids:
                self._close(b, row, "stop")
                done.append(True)
                continue
            if not all(map(_finite, values[b])):
                raise NonFiniteLogitsError(self.step, b, values[b])
            piece = row.detokenizer.step(self.tokenizer, token_id)
            token = TokenScore(
                index=len(row.tokens) + len(row.held),
                id=token_id,
                text=piece,
                top_logits=tuple(values[b]),
                top_ids=tuple(top_ids[b]),
                au=au[b],
                eu=eu[b],
                logprob=lp[b],
                entropy=ent[b],
                temperature=None if temps is None else temps[b],
            )
            row.held.append(token)
            self._release(b, row)
            done.append(row.done)
        self.step += 1
        if self.cancel is not None and self.cancel.is_set():
            for b, row in enumerate(self.rows):
                if not row.done:
                    self._close(b, row, "cancelled")
            done = [True] * len(self.rows)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def _release(self, b: int, row: _Row) -> None:
        """Emit held tokens that can no longer belong to a stop string; stop on a match."""
        if not self.stop:
            self._emit(b, row, len(row.held))
            return
        held_text = "".join(t.text for t in row.held)
        match = min(
            ((held_text.find(s), s) for s in self.stop if s in held_text),
            default=None,
        )
        if match is not None:
            cut, seq = match
            keep, offset = 0, 0
            for i, t in enumerate(row.held):
                if offset >= cut:
                    break
                end = offset + len(t.text)
                if end > cut:
                    row.held[i] = _replace_text(t, t.text[: cut - offset])
                offset = end
                keep = i + 1
            del row.held[keep:]
            self._emit(b, row, len(row.held))
            row.stop_sequence = seq
            self._close(b, row, "stop")
            return
        hold = max((_overlap(held_text, s) for s in self.stop), default=0)
        safe = len(held_text) - hold
        release, offset = 0, 0
        for t in row.held:
            offset += len(t.text)
            if offset > safe:
                break
            release += 1
        self._emit(b, row, release)

    def _emit(self, b: int, row: _Row, n: int) -> None:
        for t in row.held[:n]:
            row.tokens.append(t)
            if self.on_token is not None:
                self.on_token(b, t)
        del row.held[:n]

    def _close(self, b: int, row: _Row, reason: FinishReason) -> None:
        self._emit(b, row, len(row.held))
        row.done = True
        row.finish_reason = reason

    def finish_row(self, b: int) -> _Row:
        row = self.rows[b]
        self._emit(b, row, len(row.held))  # max_new_tokens reached with tokens still held
        return row


def _replace_text(t: TokenScore, text: str) -> TokenScore:
    import dataclasses

    return dataclasses.replace(t, text=text)


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


class _DynamicTemperatureProcessor:
    """Logits processor dividing each row's scores by ``T(EU_t)`` of the current step.

    Runs after the model's built-in pre-processors (repetition penalty...) and before the
    sampling warpers (top-p), reading EU from the raw logits recorded by the forward hook.
    """

    def __init__(self, recorder: _StepRecorder, schedule: Any) -> None:
        self.recorder = recorder
        self.schedule = schedule

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        pending = self.recorder.pending
        if pending is None:
            msg = "internal error: dynamic temperature called before the step's logits were recorded"
            raise RuntimeError(msg)
        s = self.schedule
        eu = pending.eu.clamp(0.0, 1.0)
        temps = s.t_min + (s.t_max - s.t_min) * (1.0 - eu) ** s.power
        self.recorder.temperatures = temps
        return scores / temps[:, None].to(scores.dtype)


# -- loading ---------------------------------------------------------------------------------
def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        msg = f"device={device!r} but no CUDA device is available; use device='cpu' or 'auto'"
        raise ConfigurationError(msg)
    return device


def _load(
    model: str | Path | None,
    device: str,
    dtype: str,
    cache_dir: str | Path | None,
    progress: ProgressCallback | None,
) -> tuple[Any, Any, str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = _resolve_device(device)
    torch_dtype = {
        "auto": torch.float32 if dev == "cpu" else torch.bfloat16,
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }[dtype]
    name = str(model) if model is not None else EMBEDDED_MODEL
    kwargs: dict[str, Any] = {}
    if name in EMBEDDED_ALIASES:
        folder = ensure_embedded_model(cache_dir, progress)
        name = EMBEDDED_MODEL
        source: str | Path = folder
    else:
        path = Path(name).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            source, kwargs["gguf_file"] = path.parent, path.name
        elif path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            if not (path / "config.json").exists() and ggufs:
                kwargs["gguf_file"] = ggufs[0].name
            source = path
        elif path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
            msg = (
                f"model path {name!r} does not exist or is not a model folder / .gguf file; "
                f"pass an existing folder, a .gguf file, or {EMBEDDED_MODEL!r}"
            )
            raise ModelLoadError(msg)
        else:
            source = name  # a hub id: local cache only
    if progress:
        progress(f"Loading {name}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError) as exc:
        msg = (
            f"could not load model {name!r} from local files ({exc.__class__.__name__}: {str(exc).splitlines()[0]}); "
            f"nothing is downloaded at run time: pass a local folder or .gguf file, put the model in the "
            f"Hugging Face cache beforehand, or use the embedded default {EMBEDDED_MODEL!r}"
        )
        raise ModelLoadError(msg) from exc
    loaded = loaded.to(dev)  # type: ignore[arg-type]
    return loaded, tokenizer, name
