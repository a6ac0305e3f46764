"""A GGUF model opened with llama.cpp's C API (through llama-cpp-python's ctypes bindings).

:class:`LlamaModel` owns the model and one context (its KV cache shared by up to ``n_seq``
sequences: one per row of a running batch), and reads the raw logits of a decoded batch
(:meth:`LlamaModel.decode`, :meth:`LlamaModel.logits_into`); a second context on the same weights
(:class:`LlamaContext`, :meth:`LlamaModel.side_context`) prefills a long prompt beside it. :class:`LlamaTokenizer` wraps the
model's vocabulary with the two calls the rest of the library uses of a tokenizer (``decode``
for streamed text pieces and the server's ``top_logprobs``, and ``encode``), plus character
offsets of each token (to find the question's tokens in a rendered prompt).
:func:`render_chat` renders chat turns with the GGUF's own template the way transformers'
``apply_chat_template`` does, so both backends feed the same text to the model.

Only llama.cpp's public C functions are used (``llama_cpp.llama_*``), never llama-cpp-python's
``Llama`` class: that class creates a single-sequence context and keeps logits only in a
log-softmaxed or all-positions form. Importing this module imports ``llama_cpp``; the backend
imports it only when it is constructed (:func:`import_llama_cpp`).
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logtoku_guard.errors import ConfigurationError, MissingDependencyError, ModelLoadError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["LlamaContext", "LlamaModel", "LlamaTokenizer", "import_llama_cpp", "render_chat"]

INSTALL_HINT = (
    "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install 'logtoku-guard[llamacpp]' (a portable build: without "
    "GGML_NATIVE=OFF llama.cpp is compiled for every instruction the CPU advertises, which a VM may not run), "
    "or bash scripts/install.sh --llamacpp in a checkout"
)


def import_llama_cpp(verbose: bool = False) -> Any:
    """The ``llama_cpp`` module, its log output set to errors only unless ``verbose``.

    Raises :class:`~logtoku_guard.errors.MissingDependencyError` naming the extra when
    llama-cpp-python is not installed.
    """
    try:
        import llama_cpp
    except ImportError as exc:
        msg = f"the llama.cpp backend needs llama-cpp-python ({exc}): {INSTALL_HINT}"
        raise MissingDependencyError(msg) from exc
    from logtoku_guard.backends.quiet import route_llama_cpp_log

    route_llama_cpp_log(llama_cpp, verbose)  # llama.cpp's log at its real levels: errors only unless verbose
    return llama_cpp


class LlamaContext:
    """One llama.cpp context on a loaded model's weights: its KV cache (shared by up to ``n_seq``
    sequences), its batch and its raw logits (:meth:`decode`, :meth:`logits_into`).

    :class:`LlamaModel` is the model with its first context; :meth:`LlamaModel.side_context` opens a
    second on the same weights (a long prompt's prefill runs there, in a thread of its own, while the
    first decodes: :mod:`~logtoku_guard.backends.llamacpp_loop`), and :meth:`copy_sequence` moves a
    sequence's KV cells from one context to another.
    """

    lib: Any
    ctx: Any
    batch: Any
    memory: Any
    n_ctx: int
    n_batch: int
    n_vocab: int

    def _open(
        self, lib: Any, model: Any, path: Path, *, n_ctx: int, n_seq: int, n_threads: int, n_ubatch: int, flash_attn: bool | None
    ) -> None:
        import numpy as np

        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = min(n_ctx, n_ubatch)
        cparams.n_seq_max = n_seq
        cparams.kv_unified = True
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        if flash_attn is not None:
            cparams.flash_attn_type = int(flash_attn)  # LLAMA_FLASH_ATTN_TYPE_DISABLED 0 / _ENABLED 1 (-1: auto)
        ctx = lib.llama_init_from_model(model, cparams)
        if not ctx:
            msg = f"llama.cpp could not create a context of n_ctx={n_ctx} for {str(path)!r}; try a smaller n_ctx"
            raise ModelLoadError(msg)
        self.lib = lib
        self.ctx = ctx
        self.memory = lib.llama_get_memory(ctx)
        self.n_ctx = int(lib.llama_n_ctx(ctx))
        self.n_batch = n_ctx
        self.batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model)))
        self._np = np

    def decode(self, tokens: Sequence[tuple[int, int, int, bool]]) -> None:
        """Decode one batch of ``(token, position, sequence id, wants logits)`` entries.

        The logits of the entries that want them are readable (:meth:`logits_into`) until the
        next call. Raises RuntimeError when llama.cpp cannot (no free KV cell, a bad position).
        """
        if len(tokens) > self.n_batch:
            msg = f"internal error: {len(tokens)} tokens in one llama.cpp batch of at most {self.n_batch}"
            raise RuntimeError(msg)
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(tokens):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits
        b.n_tokens = len(tokens)
        code = int(self.lib.llama_decode(self.ctx, b))
        if code != 0:
            reason = "no free KV-cache cell (raise n_ctx)" if code == 1 else "see llama.cpp's log (verbose=True)"
            msg = f"llama_decode failed with code {code}: {reason}"
            raise RuntimeError(msg)

    def logits_into(self, index: int, out: np.ndarray) -> None:
        """Copy the raw float32 logits of batch entry ``index`` of the last decode into ``out`` ``(vocab,)``."""
        ptr = self.lib.llama_get_logits_ith(self.ctx, index)
        if not ptr:
            msg = f"internal error: llama.cpp kept no logits for batch entry {index}"
            raise RuntimeError(msg)
        ctypes.memmove(out.ctypes.data, ptr, self.n_vocab * 4)

    def logits_rows(self, indices: Sequence[int]) -> np.ndarray:
        """The raw float32 logits of batch entries ``indices`` (ascending) of the last decode, ``(len(indices), vocab)``.

        llama.cpp keeps the logits of a batch's outputs side by side in batch order, so the rows of
        consecutive entries that asked for logits are a view of its own buffer: nothing is copied.
        The view is valid until the next decode (read it before). Where the rows are not side by
        side (entries between them that asked for logits too), they are copied.
        """
        np = self._np
        if not indices:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        first = self.lib.llama_get_logits_ith(self.ctx, indices[0])
        last = self.lib.llama_get_logits_ith(self.ctx, indices[-1])
        if not first or not last:
            msg = f"internal error: llama.cpp kept no logits for batch entries {indices[0]}..{indices[-1]}"
            raise RuntimeError(msg)
        row = self.n_vocab * 4
        start, end = ctypes.cast(first, ctypes.c_void_p).value, ctypes.cast(last, ctypes.c_void_p).value
        if start is not None and end is not None and end - start == (len(indices) - 1) * row:
            return np.ctypeslib.as_array(ctypes.cast(first, ctypes.POINTER(ctypes.c_float)), shape=(len(indices), self.n_vocab))
        out = np.empty((len(indices), self.n_vocab), dtype=np.float32)
        for j, i in enumerate(indices):
            self.logits_into(i, out[j])
        return out

    def forget(self, seq: int) -> None:
        """Drop sequence ``seq`` from the KV cache (its cells become free)."""
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)

    def set_threads(self, n_threads: int) -> None:
        self.lib.llama_set_n_threads(self.ctx, n_threads, n_threads)

    def copy_sequence(self, source: LlamaContext, seq: int) -> bool:
        """Copy sequence ``seq``'s KV cells (and positions) from ``source``, another context on the same
        weights, into this one under the same id, replacing what this one held of it.

        Returns False when this cache has no run of free cells long enough (llama.cpp places a copied
        sequence's cells side by side); nothing is changed then. The copy is exact: the sequence decodes
        here as it would have there (the cells' bytes are llama.cpp's own state format).
        """
        lib = self.lib
        size = int(lib.llama_state_seq_get_size(source.ctx, seq))
        buf = (ctypes.c_uint8 * size)()
        written = int(lib.llama_state_seq_get_data(source.ctx, buf, size, seq))
        if written <= 0:
            msg = f"internal error: llama.cpp wrote no state for sequence {seq} ({size} bytes expected)"
            raise RuntimeError(msg)
        return int(lib.llama_state_seq_set_data(self.ctx, buf, written, seq)) > 0

    def _close_context(self) -> None:
        lib = self.lib
        if getattr(self, "batch", None) is not None:
            lib.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            lib.llama_free(self.ctx)
            self.ctx = None

    def close(self) -> None:
        """Free the context (idempotent)."""
        self._close_context()


class LlamaModel(LlamaContext):
    """A GGUF model and its llama.cpp context (a second, on the same weights, on demand: :meth:`side_context`).

    Args:
        path: the ``.gguf`` file.
        n_ctx: KV-cache cells shared by every sequence (a unified cache: rows of a batch use
            what they need).
        n_seq: most sequences in the KV cache at once (batch rows, and rows that ended whose
            cells are not freed yet).
        n_threads: CPU threads for decoding and prompt processing.
        n_ubatch: most tokens llama.cpp computes in one pass of a prefill (longer prompts take several).
        flash_attn: llama.cpp's flash attention on (True) or off (False); None lets llama.cpp choose
            (its default, "auto": on for a CPU). On the embedded F16 model a decoding step in a short
            context is 0-4% quicker with it on, and 2-3x slower 7,000 tokens deep
            (``benchmarks/bench_llamacpp.py --parts flash_attn``).
        verbose: let llama.cpp print its loading log.
    """

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        n_seq: int,
        n_threads: int,
        n_ubatch: int = 512,
        flash_attn: bool | None = None,
        verbose: bool = False,
    ) -> None:
        if flash_attn is not None and not isinstance(flash_attn, bool):
            msg = f"flash_attn must be True, False or None (llama.cpp's choice), got {flash_attn!r}"
            raise ConfigurationError(msg)

        self.lib = lib = import_llama_cpp(verbose)
        if n_seq > int(lib.llama_max_parallel_sequences()):
            most = int(lib.llama_max_parallel_sequences())
            msg = f"{n_seq} sequences (2 x max_batch) are more than llama.cpp's {most}; use max_batch <= {most // 2}"
            raise ConfigurationError(msg)
        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        model = lib.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if not model:
            msg = f"llama.cpp could not load {str(path)!r} (not a GGUF model it supports?); pass a .gguf file llama.cpp can run"
            raise ModelLoadError(msg)
        self.model = model
        self.vocab = lib.llama_model_get_vocab(model)
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(model))
        settings: dict[str, Any] = {"n_ctx": n_ctx, "n_seq": n_seq, "n_threads": n_threads, "n_ubatch": n_ubatch}
        settings["flash_attn"] = flash_attn
        self._settings = settings
        self._path = path
        self._side: LlamaContext | None = None
        try:
            self._open(lib, model, path, **self._settings)
        except ModelLoadError:
            lib.llama_model_free(model)
            self.model = None
            raise

    def side_context(self) -> LlamaContext:
        """A second context on the same weights, with this one's settings (opened on first use, kept until
        :meth:`close`): its own KV cache of ``n_ctx`` cells, so its memory is that cache and its buffers."""
        if self._side is None:
            if not self.model:
                msg = "this llama.cpp model was closed"
                raise RuntimeError(msg)
            side = LlamaContext()
            side._open(self.lib, self.model, self._path, **self._settings)
            self._side = side
        return self._side

    def metadata(self, key: str) -> str | None:
        """The GGUF metadata value of ``key`` as a string (None when absent)."""
        size = self.lib.llama_model_meta_val_str(self.model, key.encode(), None, 0)
        if size < 0:
            return None
        buf = ctypes.create_string_buffer(size + 1)
        self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, size + 1)
        return buf.value.decode("utf-8", errors="replace")

    def close(self) -> None:
        """Free the contexts and the model (idempotent)."""
        if getattr(self, "_side", None) is not None:
            self._side.close()  # type: ignore[union-attr]
            self._side = None
        self._close_context()
        if getattr(self, "model", None):
            self.lib.llama_model_free(self.model)
            self.model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            return


class LlamaTokenizer:
    """The model's vocabulary as a tokenizer: ``encode``, ``decode``, each token's text offsets.

    ``decode(ids, skip_special_tokens=True)`` has transformers' signature (the incremental
    detokenizer and the server call it); invalid UTF-8 (a character whose bytes are split
    across tokens) comes out as U+FFFD, as a transformers tokenizer decodes it.
    """

    def __init__(self, model: LlamaModel) -> None:
        self._lib = model.lib
        self._vocab = model.vocab
        self.vocab_size = model.n_vocab
        lib = self._lib
        self.eos_token_id = int(lib.llama_vocab_eos(self._vocab))
        self.bos_token_id = int(lib.llama_vocab_bos(self._vocab))
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self._vocab)) and self.bos_token_id >= 0
        """Whether the model wants BOS before a prompt (its GGUF's ``tokenizer.ggml.add_bos_token``):
        Gemma does (without it, it answers "??????"), SmolLM2 does not."""
        self.eog_ids = frozenset(t for t in range(self.vocab_size) if lib.llama_vocab_is_eog(self._vocab, t))
        self._piece = lru_cache(maxsize=None)(self._piece_uncached)

    def _piece_uncached(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = int(self._lib.llama_token_to_piece(self._vocab, token, buf, 64, 0, special))
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = int(self._lib.llama_token_to_piece(self._vocab, token, buf, -n, 0, special))
        return buf.raw[:n]

    def piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of ``token`` (a control token's own text with ``special``, else nothing)."""
        if not 0 <= token < self.vocab_size:
            msg = f"token id {token} is outside the vocabulary (0..{self.vocab_size - 1})"
            raise ConfigurationError(msg)
        return self._piece(token, special)

    def token_text(self, token: int | None) -> str | None:
        """The text of a special token such as BOS or EOS (None when the model has none)."""
        if token is None or token < 0:
            return None
        return self.piece(token).decode("utf-8", errors="replace")

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of ``text``, no BOS added; with ``special``, special tokens' text (``<|im_start|>``) is
        parsed as those tokens (the chat template's markup), without it read as text (a user's message)."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (ctypes.c_int32 * cap)()
        n = int(self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, False, special))
        if n < 0:
            cap = -n
            buf = (ctypes.c_int32 * cap)()
            n = int(self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, False, special))
        return list(buf[:n])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = False) -> str:
        return b"".join(self.piece(int(t), not skip_special_tokens) for t in ids).decode("utf-8", errors="replace")

    def offsets(self, text: str, ids: Sequence[int]) -> list[tuple[int, int]]:
        """Each token's ``(start, end)`` character offsets in ``text`` (its encoding ``ids``).

        A token's span covers its bytes (a leading space included, as a byte-level BPE fast
        tokenizer reports it), widened to whole characters: the tokens of one multi-byte
        character each span that character.
        """
        data = text.encode("utf-8")
        floor = [0] * (len(data) + 1)  # byte offset -> the character it lies in
        ceil = [0] * (len(data) + 1)  # byte offset -> the first character starting at or after it
        pos = 0
        for ci, ch in enumerate(text):
            n = len(ch.encode("utf-8"))
            for j in range(n):
                floor[pos + j] = ci
                ceil[pos + j] = ci if j == 0 else ci + 1
            pos += n
        floor[len(data)] = ceil[len(data)] = len(text)
        out: list[tuple[int, int]] = []
        byte = 0
        for t in ids:
            piece = self.piece(int(t))
            a, b = floor[min(byte, len(data))], ceil[min(byte + len(piece), len(data))]
            byte += len(piece)
            out.append((a, b))
        return out


def render_chat(template: str, turns: list[dict[str, str]], special: dict[str, str]) -> str:
    """``turns`` rendered with a chat ``template`` and the generation prompt, as transformers renders them.

    The same Jinja environment as transformers' ``apply_chat_template`` (sandboxed,
    ``trim_blocks``, ``lstrip_blocks``, loop controls, its ``tojson``, ``raise_exception`` and
    ``strftime_now``), with the special tokens (``bos_token``, ``eos_token``...) as variables.
    """
    return _compiled(template).render(messages=turns, add_generation_prompt=True, tools=None, documents=None, **special)


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        msg = f"the model's chat template does not parse ({exc}); fix tokenizer.chat_template in the GGUF file"
        raise ConfigurationError(msg) from exc
