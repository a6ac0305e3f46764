"""The llama.cpp loop's rows (:class:`Sequence`) and the sums its admission makes with them.

:func:`question_positions`: the prompt positions whose logits score the question;
:func:`prefill_steps`: the most steps a prompt's prefill takes; :func:`shadow`: when a waiting row
is sure to fit the KV cache.

A row is admitted only when its prompt plus its token limit fits in the KV cells the live rows
have not reserved, so a running batch never runs out of cache; a request alone always fits
(its limit is clamped to the context when it is prepared, and a prompt that fills the context
is refused then, before it is queued: :func:`~logtoku_guard.backends.batched.fit_new_tokens`).
A waiting row that does not fit does not hold up the rows behind it that do
(:meth:`~logtoku_guard.backends.llamacpp_loop.LlamaDecodeLoop._admit`): they are admitted around it,
EASY backfilling as batch schedulers do it, as long as they do not delay the step at which the first
row that waits is sure to fit (:func:`shadow`), so that row is never starved by a stream of short requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from logtoku_guard.backends.batching import Job, PreparedRow
from logtoku_guard.backends.chunked_prefill import chunk_at, piece_at
from logtoku_guard.backends.recorder import Row
from logtoku_guard.types import TokenScore

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Sequence", "prefill_steps", "question_positions", "shadow"]


@dataclass(eq=False)
class Sequence:
    """One row: its request, prompt, llama.cpp sequence id and decoding state."""

    job: Job
    index: int  # the row's place in its job
    prepared: PreparedRow
    seq: int  # llama.cpp sequence id
    start: float  # perf_counter() when it was admitted
    kept: range  # prompt positions whose logits score the question (each predicts the next token)
    fed: int = 0  # prompt tokens already in the KV cache
    pos: int = 0  # tokens of this sequence in the KV cache
    last: int = -1  # the token fed at the next decode step
    state: Row | None = None  # set when its first answer token's logits are read
    prompt_scores: tuple[TokenScore, ...] = ()
    first_token_s: float | None = None
    rng: np.random.Generator | None = None  # the row's random stream when its request samples (None: greedy)

    @property
    def reserved(self) -> int:
        """KV cells this row may use: its prompt and its token limit."""
        return len(self.prepared.ids) + self.prepared.limit

    def steps_left(self, chunk: int | None, pieces: bool = False) -> int:
        """Most decoding steps before this row ends: the chunks (or pieces) of its prompt still to
        feed, then its tokens still to generate (each row ends by its token limit at the latest)."""
        made = 0 if self.state is None else len(self.state.tokens) + len(self.state.held)
        return prefill_steps(len(self.prepared.ids), self.fed, chunk, pieces) + self.prepared.limit - made


def prefill_steps(ids: int, fed: int, chunk: int | None, pieces: bool = False) -> int:
    """Most steps that feed the rest of an ``ids``-token prompt with ``fed`` tokens in: one for a
    new prompt of at most one chunk, else one per chunk
    (:func:`~logtoku_guard.backends.chunked_prefill.chunk_at`), or with ``pieces`` (a budgeted
    prefill, at least one piece a step) one per piece (:func:`~logtoku_guard.backends.chunked_prefill.piece_at`)."""
    if fed >= ids:
        return 0
    if chunk is None or (fed == 0 and ids <= chunk):
        return 1
    steps = 0
    while fed < ids:
        fed += piece_at(fed) if pieces else (chunk_at(fed, chunk) or ids)
        steps += 1
    return steps


def shadow(running: list[tuple[int, int]], free: int, need: int) -> tuple[int, int]:
    """When a waiting row of ``need`` KV cells is sure to fit, and how many cells are spare then.

    ``running`` lists each running row's reserved cells and most steps before it ends; ``free``
    is the cells not reserved now. Returns ``(steps, spare)``: after ``steps`` steps at the
    latest enough rows have ended for ``need`` cells, and ``spare`` cells are free beside it.
    A row admitted now around the waiting one delays it only if it runs past ``steps`` and
    takes more than ``spare`` cells (EASY backfilling).
    """
    steps = 0
    for cells, left in sorted(running, key=lambda r: r[1]):
        if free >= need:
            break
        free += cells
        steps = left
    return steps, max(free - need, 0)


def question_positions(prepared: PreparedRow) -> range:
    """Prompt positions whose logits score the question's tokens (position ``i`` predicts ``i + 1``)."""
    span = prepared.span
    if span is None or not prepared.score_prompt or span.end <= max(span.start, 1):
        return range(0)
    return range(max(span.start, 1) - 1, span.end - 1)
