"""Incremental detokenization: each generated token's text piece in bounded work per step.

Used by the step recorder (:mod:`logtoku_guard.backends.recorder`) once per row per step.
Pure Python; the tokenizer is anything with a transformers-style ``decode(ids, ...)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

MAX_PENDING = 16
"""Tokens a row may hold back without new text before they are flushed as they decode.

A UTF-8 character spans at most 4 bytes, so byte-level tokens hold text back for at most 3
steps; only invalid UTF-8 or a long run of skipped special tokens reaches this bound, which
keeps the decoded window, hence each step's work, independent of the answer's length. The
flush renders incomplete bytes as U+FFFD: only a valid character whose bytes straddle it
(after 16 tokens of invalid UTF-8) could come out differently from a whole-answer decode.
"""


@dataclass
class IncrementalDetokenizer:
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
        prefix_text = decode(tokenizer, self.ids[start:read]) if read > start else ""
        text = decode(tokenizer, self.ids[start:])
        # A trailing U+FFFD is an incomplete UTF-8 character: its bytes come with a later token.
        complete = len(text) > len(prefix_text) and not text.endswith("\ufffd")
        if not complete and len(self.ids) - read <= MAX_PENDING:
            return ""
        self.prefix_offset, self.read_offset = read, len(self.ids)
        # A decoder that rewrites earlier text: only what goes past the emitted text is new.
        return text[len(prefix_text) :]


def decode(tokenizer: Any, ids: list[int]) -> str:
    """The text of ``ids`` as an answer shows it: special tokens skipped, spaces untouched.

    A transformers tokenizer backed by the ``tokenizers`` library whose class (and instance)
    keeps its ``decode``/``_decode`` is decoded by its ``tokenizers.Tokenizer`` directly:
    exactly what its ``decode`` does with these arguments, without its Python layers (this runs
    twice per row per decoding step, where the per-call overhead is most of the cost).
    """
    plain = _plain_tokenizers_backend(tokenizer.__class__) and "decode" not in getattr(tokenizer, "__dict__", {})
    raw = getattr(tokenizer, "_tokenizer", None) if plain else None
    if raw is not None:
        return str(raw.decode(ids, skip_special_tokens=True))
    return str(tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))


@functools.lru_cache(maxsize=64)
def _plain_tokenizers_backend(cls: Any) -> bool:
    """Whether ``cls`` is transformers' ``tokenizers``-backed tokenizer with its own ``decode`` path."""
    if not cls.__module__.startswith("transformers."):  # another library's tokenizer: never import transformers for it
        return False
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout, or none: the public decode
        return False
    return (
        issubclass(cls, TokenizersBackend)
        and getattr(cls, "_decode", None) is TokenizersBackend._decode
        and getattr(cls, "decode", None) is PreTrainedTokenizerBase.decode
    )
