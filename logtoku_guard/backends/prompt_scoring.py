"""Prompt-side scores from the prefill pass: how surprising the user's question is to the model.

An invented name is surprising before the model answers. :class:`PromptCapture` is a forward
hook on the model's decoder (the module whose output feeds the LM head). At the *prefill*
pass only (the first call of ``generate``) it takes the final hidden states at the positions
just before each question token, applies the model's own output head (and its logit
soft-capping or scaling, where the config has one), and scores each question token
teacher-forced: the logits at position ``i`` score the token at ``i + 1``. Each prompt token
gets a :class:`~logtoku_guard.types.TokenScore` exactly as an answer token does (raw top-K
logits, AU/EU, log-probability of the actual token, entropy).

Two ways, both inside the prefill's own forward pass (no second forward). Usually the decode
loop asks the model for the logits of the positions that predict question tokens as well as
the last one (:func:`kept_positions`, passed as a tensor ``logits_to_keep``): the output
head runs once over those rows (one pass over its weights for the whole batch, shared with
the first answer token's logits), and :func:`score_kept` scores them. When there are too
many (a long question, a large batch: more than :data:`CHUNK` rows) or the model takes no
``logits_to_keep``, :class:`PromptCapture`, a forward hook on the decoder, applies the head to
the question's positions itself, in chunks, so that ``prompt x vocabulary`` floats are never
kept for the whole prompt (template, retrieved passages).

:func:`question_span` finds the question (the last user turn's text) in the rendered prompt
and maps it to token positions through the fast tokenizer's character offsets.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from logtoku_guard.scoring.uncertainty import EvidenceMode, logsumexp_entropy, logtoku
from logtoku_guard.types import TokenScore

if TYPE_CHECKING:
    import torch

__all__ = ["PromptCapture", "QuestionSpan", "for_batch", "kept_positions", "question_span", "score_kept", "shift_spans"]

CHUNK = 256
"""Rows sent through the output head at once (bounds the ``chunk x vocabulary`` buffer)."""


@dataclass(frozen=True)
class QuestionSpan:
    """Token positions ``[start, end)`` of the question in a (padded) row and each token's text.

    ``texts`` concatenate to the question exactly (the whitespace before a token belongs to
    the token before it, as the offsets place it).
    """

    start: int
    end: int
    texts: tuple[str, ...]
    first_index: int = 0
    """The question-token index of ``start`` (0 unless the span is a :meth:`part`)."""

    def part(self, start: int, end: int | None = None) -> QuestionSpan | None:
        """The tokens of this span at positions ``[start, end)`` (None when there are none), each
        keeping its question-token index: what one chunk of a prompt prefilled in parts scores."""
        lo, hi = max(start, self.start), self.end if end is None else min(end, self.end)
        if lo >= hi:
            return None
        if (lo, hi) == (self.start, self.end):
            return self
        cut = lo - self.start
        return QuestionSpan(lo, hi, self.texts[cut : cut + hi - lo], self.first_index + cut)


def question_span(rendered: str, question: str, offsets: Sequence[tuple[int, int]], mask: Sequence[int]) -> QuestionSpan | None:
    """The tokens of ``question`` (its last occurrence in ``rendered``), or None when not found.

    ``offsets``: each token's ``(start, end)`` character offsets in ``rendered`` (a fast
    tokenizer's ``offset_mapping``); ``mask``: the attention mask (0 = padding, skipped).
    """
    pos = rendered.rfind(question) if question else -1
    if pos < 0:
        return None
    end_char = pos + len(question)
    idx = [j for j, ((a, b), m) in enumerate(zip(offsets, mask)) if m and b > a and b > pos and a < end_char]
    if not idx:
        return None
    starts = [max(offsets[j][0], pos) for j in idx]
    starts[0] = pos
    bounds = [*starts[1:], end_char]
    texts = tuple(rendered[s:e] for s, e in zip(starts, bounds))
    return QuestionSpan(idx[0], idx[-1] + 1, texts)


class PromptCapture:
    """Forward hook on the decoder: scores the question tokens of each row at the prefill pass.

    The hook acts on the passes of the thread that built it only: a long prompt's chunks may run
    through the same decoder from a thread of their own meanwhile (a concurrent prefill,
    :class:`~logtoku_guard.backends.chunked_prefill.Beside`).

    Args:
        head: the model's output embedding (``model.get_output_embeddings()``).
        config: the model config (``final_logit_softcapping``/``logit_scale`` are applied).
        input_ids: ``(batch, seq)`` prompt ids (left-padded), on any device.
        spans: each row's :class:`QuestionSpan` (None: nothing scored for that row).
        k: top-K logits kept per token; evidence: ``"clamped"`` or ``"raw"``.
    """

    def __init__(
        self,
        head: Any,
        config: Any,
        input_ids: torch.Tensor,
        spans: Sequence[QuestionSpan | None],
        k: int,
        evidence: EvidenceMode,
    ) -> None:
        self.head = head
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.scale = getattr(config, "logit_scale", None)
        self.input_ids = input_ids
        self.spans = list(spans)
        self.k = k
        self.evidence = evidence
        self.done = False
        self.scores: list[tuple[TokenScore, ...]] = [() for _ in spans]
        self.thread = threading.get_ident()

    def hook(self, module: Any, args: Any, output: Any) -> None:
        if self.done or threading.get_ident() != self.thread:
            return
        self.done = True  # decode steps (one new token each) are not the prompt
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None:
            hidden = output[0]
        if hidden.shape[1] != self.input_ids.shape[1]:
            return  # not the prefill of these ids (e.g. a cached prefix): nothing to score
        for row, span in enumerate(self.spans):
            if span is not None:
                self.scores[row] = self._score_row(hidden[row], self.input_ids[row], span)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Raw float32 logits of ``hidden`` ``(n, d)`` as the model computes them."""
        import torch

        logits = self.head(hidden).float()
        if isinstance(self.scale, (int, float)) and not isinstance(self.scale, bool):
            logits = logits * float(self.scale)
        if isinstance(self.softcap, (int, float)) and self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def score_part(self, hidden: torch.Tensor, offset: int, row: int = 0) -> tuple[TokenScore, ...]:
        """Row ``row``'s question tokens predicted by ``hidden``, the final hidden states ``(n, d)`` of
        its prompt positions ``offset .. offset + n - 1`` (one chunk of a prompt prefilled in parts:
        the token at ``offset + n`` is scored here, by the chunk's last position)."""
        span = self.spans[row]
        return () if span is None else self._score_row(hidden, self.input_ids[row], span, offset)

    def _score_row(self, hidden: torch.Tensor, ids: torch.Tensor, span: QuestionSpan, offset: int = 0) -> tuple[TokenScore, ...]:
        first = max(span.start, 1, offset + 1)  # position 0 has no prediction
        end = min(span.end, offset + hidden.shape[0] + 1)
        out: list[TokenScore] = []
        for lo in range(first, end, CHUNK):
            hi = min(lo + CHUNK, end)
            logits = self.logits(hidden[lo - 1 - offset : hi - 1 - offset])
            out.extend(_score(logits, ids[lo:hi], span, lo, self.k, self.evidence))
        return tuple(out)


def _score(
    logits: torch.Tensor, target: torch.Tensor, span: QuestionSpan, lo: int, k: int, evidence: EvidenceMode
) -> list[TokenScore]:
    """The question tokens ``target`` (at positions ``lo, lo + 1...``) scored by ``logits``, the
    raw float32 logits of the positions just before each."""
    target = target.to(logits.device)
    values, top_ids = logits.topk(k, dim=-1)
    au, eu = logtoku(values, evidence)
    lse, entropy = logsumexp_entropy(logits)
    logprob = logits.gather(-1, target[:, None]).squeeze(-1) - lse
    rows = zip(target.tolist(), values.tolist(), top_ids.tolist(), au.tolist(), eu.tolist(), logprob.tolist(), entropy.tolist())
    return [
        TokenScore(
            index=span.first_index + lo + j - span.start,
            id=int(tid),
            text=span.texts[lo + j - span.start],
            top_logits=tuple(v),
            top_ids=tuple(ti),
            au=a,
            eu=e,
            logprob=lp,
            entropy=h,
        )
        for j, (tid, v, ti, a, e, lp, h) in enumerate(rows)
    ]


def kept_positions(spans: Sequence[QuestionSpan | None], width: int) -> list[int] | None:
    """The prefill positions whose logits score every row's question, then the last position
    (``width - 1``, the first answer token's logits), sorted; None when the batch would need
    more than :data:`CHUNK` rows of logits (then :class:`PromptCapture` scores in chunks).

    ``spans`` are in the prefill's (padded) coordinates; the logits at position ``i`` score the
    token at ``i + 1``.
    """
    needed = {width - 1}
    for span in spans:
        if span is not None:
            needed.update(range(max(span.start, 1) - 1, span.end - 1))
    if len(spans) * len(needed) > CHUNK:
        return None
    return sorted(needed)


def score_kept(
    logits: torch.Tensor, kept: Sequence[int], ids: torch.Tensor, span: QuestionSpan | None, k: int, evidence: EvidenceMode
) -> tuple[TokenScore, ...]:
    """One row's question scored from the logits of the ``kept`` positions (:func:`kept_positions`).

    ``logits``: that row's ``(len(kept), vocab)`` raw logits; ``ids``: its prefill token ids.
    """
    if span is None or span.end <= max(span.start, 1):
        return ()
    first = max(span.start, 1)
    at = kept.index(first - 1)  # the row's positions are consecutive in the sorted kept ones
    return tuple(_score(logits[at : at + span.end - first].float(), ids[first : span.end], span, first, k, evidence))


def shift_spans(spans: Sequence[tuple[QuestionSpan | None, int]]) -> list[QuestionSpan | None]:
    """Each row's span moved right by ``shift`` tokens (its left padding, less any leading tokens
    not fed to this forward): ``spans`` holds ``(span, shift)``."""
    return [
        None if span is None else dataclasses.replace(span, start=span.start + pad, end=span.end + pad) for span, pad in spans
    ]


def for_batch(
    model: Any, input_ids: torch.Tensor, spans: Sequence[QuestionSpan | None], k: int, evidence: EvidenceMode
) -> PromptCapture | None:
    """The capture hook for a left-padded batch (``spans`` already in its padded coordinates:
    :func:`shift_spans`). None when no row has a span or the model has no decoder module to hook."""
    get_decoder = getattr(model, "get_decoder", None)
    if not callable(get_decoder) or get_decoder() is None or all(span is None for span in spans):
        return None
    return PromptCapture(model.get_output_embeddings(), model.config, input_ids, spans, k, evidence)
