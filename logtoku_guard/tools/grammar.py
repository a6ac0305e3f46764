"""Grammar-constrained decoding: a :mod:`~logtoku_guard.tools.constraints` constraint as a per-step token mask.

The engine is `llguidance <https://github.com/guidance-ai/llguidance>`_ (the ``tools`` extra,
imported lazily), chosen on measurements (``benchmarks/tool_calls/RESULTS.md``): no
dependencies of its own, Hugging Face fast tokenizers and llama.cpp vocabularies read
natively, JSON Schema and Lark grammars compiled in about a millisecond, tens of microseconds
per mask on a 49k vocabulary (the same engine llama.cpp and vLLM ship). Both local backends
use it: the transformers decode loop masks a torch tensor, the llama.cpp loop a numpy array.

:class:`GrammarEngine` holds one tokenizer's llguidance view (built once, ~0.3 s) and starts a
:class:`RowGrammar` per generated row. A decode loop, at each step, records the raw logits
first (LogTokU scores the model, not the grammar), then asks :func:`allowed_tokens` for the
rows' masks and sets the disallowed scores to ``-inf`` before choosing; the step recorder
advances each row's grammar with the chosen token (:meth:`RowGrammar.advance`) and ends the
row when the grammar is complete.

Tool calls with ``choice="auto"`` are a trigger: no mask while the model writes prose; once
its text contains :data:`~logtoku_guard.tools.constraints.TOOL_CALL_OPEN`, the bytes after it are
fed to a grammar of ``"[\n" call "\n]</tool_call>"`` and every later token is masked by it.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from logtoku_guard.errors import ConfigurationError, GrammarError, MissingDependencyError, short_repr
from logtoku_guard.tools.constraints import (
    CALL_LIST_CLOSE,
    CALL_LIST_OPEN,
    JSON_STYLE,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Constraint,
    JsonSchema,
    ToolCalls,
    bounded_schema,
    tool_call_schema,
)

__all__ = ["GrammarEngine", "RowGrammar", "allowed_tokens", "grammar_text", "require_llguidance"]

log = logging.getLogger(__name__)


def require_llguidance() -> Any:
    """The ``llguidance`` module, or a :class:`MissingDependencyError` naming the extra to install."""
    try:
        import llguidance
    except ImportError as exc:
        msg = "constrained decoding (tool calls, JSON schema) needs llguidance: pip install 'logtoku-guard[tools]'"
        raise MissingDependencyError(msg) from exc
    return llguidance


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a Lark string literal is a JSON string literal for these tags


def grammar_text(constraint: Constraint, *, after_open: bool = False) -> str:
    """The llguidance grammar (Lark, with ``%json`` for schemas) of ``constraint``.

    ``after_open``: for a tool call, the grammar of what follows :data:`TOOL_CALL_OPEN`
    (the list of one call's JSON, then the closing tag), used once ``"auto"`` prose has opened a call.
    """
    if isinstance(constraint, JsonSchema):
        schema = {**bounded_schema(constraint.schema, constraint.max_string_length), "x-guidance": JSON_STYLE}
        return f"start: %json {json.dumps(schema)}"
    schema = {**tool_call_schema(constraint), "x-guidance": JSON_STYLE}
    body = f"{_lark_string(CALL_LIST_OPEN)} call {_lark_string(CALL_LIST_CLOSE + TOOL_CALL_CLOSE)}"
    start = body if after_open else f"{_lark_string(TOOL_CALL_OPEN)} {body}"
    return f"start: {start}\ncall: %json {json.dumps(schema)}"


GRAMMAR_LIMITS = {
    "max_items_in_row": 2_000,
    "step_max_items": 50_000,
    "step_lexer_fuel": 200_000,
    "initial_lexer_fuel": 1_000_000,
    "max_lexer_states": 100_000,
    "max_grammar_size": 200_000,
}
"""llguidance's resource limits for every request's grammar, set here rather than left to its
defaults: a compile beyond them is a 400 before decoding; a step beyond them (an ambiguous
schema whose parse explodes) fails that request's row alone (:class:`GrammarError`). A step's
cost is bounded (about 4 ms of items, 15 ms of lexer fuel), so no request's grammar can stall a batch."""


def grammar_limits() -> Any:
    llguidance = require_llguidance()
    return llguidance.LLParserLimits(**GRAMMAR_LIMITS)


class GrammarEngine:
    """One tokenizer's grammar engine: compiles constraints and starts a :class:`RowGrammar` per row.

    Args:
        tokenizer: an llguidance ``LLTokenizer`` (see :meth:`from_hf`).
        vocab_size: the width of the model's logits (may exceed the tokenizer's vocabulary).
    """

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)

    @classmethod
    def from_hf(cls, tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]) -> GrammarEngine:
        """From a Hugging Face fast tokenizer; ``eos_ids`` end a row (allowed once the grammar accepts)."""
        require_llguidance()
        import llguidance.hf

        if not getattr(tokenizer, "is_fast", False):
            msg = f"constrained decoding needs a fast (Rust) Hugging Face tokenizer, got {type(tokenizer).__name__}"
            raise ConfigurationError(msg)
        eos = sorted(eos_ids) or None
        return cls(llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos), vocab_size)

    @classmethod
    def from_llama(cls, model: Any, eos_ids: Iterable[int]) -> GrammarEngine:
        """From a llama.cpp model (:class:`~logtoku_guard.backends.llamacpp_model.LlamaModel`: its ``vocab``
        pointer and ``n_vocab``); ``eos_ids`` end a row."""
        require_llguidance()
        import llguidance.llamacpp

        eos = sorted(eos_ids) or None
        with warnings.catch_warnings():  # llama-cpp-python warns once per token that llama_token_get_attr is deprecated
            warnings.filterwarnings("ignore", message="llama_token_get_attr is deprecated", category=DeprecationWarning)
            tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(model.vocab, n_vocab=model.n_vocab, eos_token=eos)
        return cls(tokenizer, model.n_vocab)

    def matcher(self, grammar: str) -> Any:
        """A fresh llguidance matcher of ``grammar`` under :data:`GRAMMAR_LIMITS`; a
        :class:`ConfigurationError` when it does not compile."""
        llguidance = require_llguidance()
        m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=grammar_limits())
        if m.is_error():
            msg = f"the constraint cannot be compiled into a grammar: {m.get_error()}"
            raise ConfigurationError(msg)
        return m

    def start(self, constraint: Constraint) -> RowGrammar:
        """A new row's grammar state for ``constraint`` (compiled now: a bad schema fails here)."""
        if isinstance(constraint, ToolCalls) and not constraint.forced:
            self.matcher(grammar_text(constraint, after_open=True))  # validate now, not mid-generation
            return RowGrammar(self, None, constraint)
        return RowGrammar(self, self.matcher(grammar_text(constraint)), constraint)


class RowGrammar:
    """One row's grammar: whether it masks this step, its mask, and its advance by each chosen token.

    ``matcher`` None: an ``"auto"`` tool-call row still in prose (no mask until the call opens).
    ``broken``: the row's text opened a call whose first bytes the grammar rejects (the model
    wrote them in the same token as the opening tag); the row then runs unconstrained, and a
    warning is logged.
    """

    def __init__(self, engine: GrammarEngine, matcher: Any, constraint: Constraint) -> None:
        self.engine = engine
        self.matcher = matcher
        self.constraint = constraint
        self.text = b""  # the row's bytes while waiting for the opening tag
        self.broken = False
        self.failure: str | None = None  # why the grammar failed mid-decoding (that row alone fails)

    @property
    def active(self) -> bool:
        """Whether this step's tokens are masked."""
        return self.matcher is not None and not self.broken

    def fill(self, bitmask: np.ndarray) -> None:
        """Write this step's allowed tokens into ``bitmask``, a C-contiguous int32 row of ``ceil(vocab / 32)`` words.

        A grammar that fails here (a resource limit) allows every token this step and fails its own
        row at :meth:`advance`: the other rows of the batch are masked as usual."""
        import llguidance.numpy

        row = bitmask[None, :] if bitmask.ndim == 1 else bitmask
        try:
            llguidance.numpy.fill_next_token_bitmask(self.matcher, row)
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            row[:] = -1
            return
        if self.matcher.is_error():
            self.failure = str(self.matcher.get_error())
            row[:] = -1

    def advance(self, token_id: int) -> bool:
        """Take the chosen token; True when the grammar is complete (the row ends).

        Raises :class:`GrammarError` (this row's request alone) when the grammar failed."""
        if self.broken:
            return False
        if self.failure is None and self.matcher is None:
            return self._wait_for_call(token_id)
        if self.failure is None and not self.matcher.consume_token(int(token_id)):
            self.failure = str(self.matcher.get_error())
        if self.failure is not None:
            msg = (
                f"the request's constraint failed while decoding ({short_repr(self.failure, 300)}); "
                "simplify the schema or tools (no recursive $ref, fewer alternatives) and ask again"
            )
            raise GrammarError(msg)
        return bool(self.matcher.is_stopped())

    def _wait_for_call(self, token_id: int) -> bool:
        """Prose of an ``"auto"`` row: look for the opening tag; once found, start the call's grammar."""
        tokenizer = self.engine.tokenizer
        self.text += tokenizer.decode_bytes([int(token_id)])
        at = self.text.find(TOOL_CALL_OPEN.encode())
        if at < 0:
            return False
        rest = self.text[at + len(TOOL_CALL_OPEN) :]
        matcher = self.engine.matcher(grammar_text(self.constraint, after_open=True))
        if rest and not matcher.consume_tokens(tokenizer.tokenize_bytes(rest)):
            self.broken = True
            log.warning(
                "the model opened a tool call with %r in the same token, which the call's grammar rejects: "
                "the rest of this answer is not constrained (its call may not parse)",
                rest[:40],
            )
            return False
        self.matcher = matcher
        return bool(matcher.is_stopped())


def allowed_tokens(rows: Sequence[RowGrammar | None], vocab_size: int) -> np.ndarray | None:
    """The ``(rows, vocab_size)`` bool mask of allowed tokens this step; None when no row is masked.

    A row without a grammar (or not masking now) allows every token.
    """
    active = [b for b, g in enumerate(rows) if g is not None and g.active]
    if not active:
        return None
    words = (vocab_size + 31) // 32
    bits = np.full((len(rows), words), -1, dtype=np.int32)
    for b in active:
        rows[b].fill(bits[b : b + 1])  # type: ignore[union-attr]
    return np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size].view(np.bool_)
