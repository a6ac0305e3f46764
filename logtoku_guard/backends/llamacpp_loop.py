"""Continuous batching on llama.cpp: each batch row is a llama.cpp sequence of one shared KV cache.

:class:`LlamaDecodeLoop` is the llama.cpp counterpart of
:class:`~logtoku_guard.backends.decode_loop.DecodeLoop`, driven by the same
:class:`~logtoku_guard.backends.batching.Batcher` and scoring with the same
:class:`~logtoku_guard.backends.recorder.StepRecorder`. Each step:

1. **decode**: one token for each live row (its last token, at its next position, in its own
   sequence) in one ``llama_decode`` (:data:`DECODE_ROWS` rows at most per call);
2. **prefill**: the prompt of each row admitted since the last step, alone in its own
   ``llama_decode`` calls, asking for logits at the positions that predict the question's
   tokens (its prompt-side scores, scored call by call) and at its last position (its first
   answer token); a prompt longer than ``prefill_chunk`` feeds one chunk at a time, after the
   shorter ones, taking turns with the live rows, so it cannot stall them
   (:mod:`~logtoku_guard.backends.chunked_prefill`).
   Rows never share a call with other
   sequences' prompt tokens: several prompts in one call changed a batched greedy answer, and
   merging them saved only a call's fixed cost (``benchmarks/README.md``). Answers equal each
   one's alone bit for bit while the cells in use stay under 256 (past that, a row whose cells
   straddle llama.cpp's 256-cell boundary can get slightly different logits);
3. **choose**: the raw logits of every row (copied out with ``llama_get_logits_ith`` before
   the next decode overwrites them) form one ``(rows, vocab)`` float32 array, scored in numpy
   (:mod:`~logtoku_guard.backends.numpy_scoring`: top-K, log-normaliser, entropy; AU/EU by the
   recorder's :func:`~logtoku_guard.scoring.uncertainty.au_eu`), and the next token is
   chosen (arg-max, or temperature / top-p sampling);
4. **leave**: rows that ended drop their sequence from the KV cache; their requests complete.

A row is admitted only when its prompt plus its token limit fits in the KV cells the live rows
have not reserved, so a running batch never runs out of cache; a request alone always fits
(its limit is clamped to the context when it is prepared).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from logtoku_guard.backends.batching import Job, JobRows, PreparedRow
from logtoku_guard.backends.chunked_prefill import FairShare, plan
from logtoku_guard.backends.decode_loop import Scoring
from logtoku_guard.backends.numpy_scoring import prompt_scores, record, sample
from logtoku_guard.backends.recorder import Row
from logtoku_guard.types import DecodingOptions, Generation, TokenScore

if TYPE_CHECKING:
    import numpy as np

    from logtoku_guard.backends.llamacpp_model import LlamaModel, LlamaTokenizer

__all__ = ["DECODE_ROWS", "OUTPUT_BUDGET", "LlamaDecodeLoop", "Sequence"]

OUTPUT_BUDGET = 256
"""Most logits rows one ``llama_decode`` asks for (bounds llama.cpp's ``rows x vocabulary`` output buffer)."""
DECODE_ROWS = 16
"""Most rows decoded in one ``llama_decode`` (below the 32 tokens at which a ubatch mixing
sequences changes llama.cpp's CPU attention results: ggml-org/llama.cpp#24962)."""


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

    @property
    def reserved(self) -> int:
        """KV cells this row may use: its prompt and its token limit."""
        return len(self.prepared.ids) + self.prepared.limit


def question_positions(prepared: PreparedRow) -> range:
    """Prompt positions whose logits score the question's tokens (position ``i`` predicts ``i + 1``)."""
    span = prepared.span
    if span is None or not prepared.score_prompt or span.end <= max(span.start, 1):
        return range(0)
    return range(max(span.start, 1) - 1, span.end - 1)


class LlamaDecodeLoop(JobRows):
    """Runs one continuous batch on a :class:`~logtoku_guard.backends.llamacpp_model.LlamaModel`.

    Args:
        model, tokenizer: the llama.cpp model (its context) and vocabulary.
        scoring: what is recorded of each step.
        options: the batch's decoding settings (``max_new_tokens`` and ``stop`` are per row).
        take_joiners: the batcher's :meth:`~logtoku_guard.backends.batching.Batcher.take_joiners`.
        finish: builds a row's :class:`~logtoku_guard.types.Generation` when it ends.
        max_rows: sequences available (the context's ``n_seq_max``).
        prefill_chunk: prompt tokens a long prompt feeds per step
            (:mod:`~logtoku_guard.backends.chunked_prefill`; None: every prompt whole).
    """

    def __init__(
        self,
        model: LlamaModel,
        tokenizer: LlamaTokenizer,
        scoring: Scoring,
        options: DecodingOptions,
        take_joiners: Callable[[int], list[Job]],
        finish: Callable[[Sequence], Generation],
        max_rows: int,
        prefill_chunk: int | None = None,
    ) -> None:
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.share = FairShare()
        self.scoring = scoring
        self.options = options
        self.take_joiners = take_joiners
        self.finish = finish
        self.free_seqs = list(range(max_rows))
        self.ended: list[Sequence] = []  # rows that left, their KV cells not freed yet
        self.live: list[Sequence] = []  # rows with a recorder row, in recorder order
        self.admitted: list[Sequence] = []  # rows being prefilled, FCFS
        self.waiting: list[tuple[Job, int, PreparedRow]] = []
        self.results: dict[Job, dict[int, Generation]] = {}
        self.recorder = scoring.recorder(tokenizer, self._on_token, self._on_row_done)
        self.rng: np.random.Generator | None = None

    # -- the loop ------------------------------------------------------------------------------
    def run(self, jobs: list[Job]) -> None:
        """Generate ``jobs`` and every job that joins; each job's future completes as its rows end."""
        import numpy as np

        self.rng = np.random.default_rng(self.options.seed)  # seeded jobs run alone: their stream is theirs
        self._queue(jobs)
        try:
            while self.live or self.admitted or self.waiting:
                self._admit()
                self._step()
                self._leave()
                rows = len(self.live) + len(self.admitted) + len(self.waiting)
                self._queue(self.take_joiners(rows))
        finally:
            self.model.clear()

    def _queue(self, jobs: list[Job]) -> None:
        self.waiting.extend((job, i, p) for job in jobs for i, p in enumerate(job.rows))

    def _admit(self) -> None:
        """Admit waiting rows, first come first served, while a sequence and their KV cells are free.

        The cells of rows that ended stay in use until a waiting row needs them
        (:meth:`_leave`); then all of them are freed at once.
        """
        used = sum(s.reserved for s in (*self.live, *self.admitted))
        while self.waiting:
            job, i, p = self.waiting[0]
            if job.future.done():  # failed or already answered: nothing to generate
                self.waiting.pop(0)
                continue
            need = len(p.ids) + p.limit
            ended = sum(s.pos for s in self.ended)
            if self.ended and (not self.free_seqs or used + ended + need > self.model.n_ctx):
                for s in self.ended:
                    self._free(s)
                self.ended = []
                continue
            if not self.free_seqs or (used + need > self.model.n_ctx and (self.live or self.admitted)):
                return
            self.waiting.pop(0)
            used += need
            self.admitted.append(Sequence(job, i, p, self.free_seqs.pop(0), time.perf_counter(), question_positions(p)))

    def _step(self) -> None:
        """Decode the live rows' next tokens, prefill the admitted rows, then choose every row's next token."""
        import numpy as np

        started = time.perf_counter()
        vocab = self.model.n_vocab
        live = list(self.live)
        step = np.empty((len(live) + len(self.admitted), vocab), dtype=np.float32)
        for lo in range(0, len(live), DECODE_ROWS):
            rows = live[lo : lo + DECODE_ROWS]
            self.model.decode([(s.last, s.pos, s.seq, True) for s in rows])
            for i, s in enumerate(rows):
                s.pos += 1
                self.model.logits_into(i, step[lo + i])
        n = len(live)
        whole, longer = plan([(s, len(s.prepared.ids) - s.fed) for s in self.admitted], self.prefill_chunk)
        for s in whole:
            if self._prefill(s, step[n], None):
                n += 1
        chunk_s = 0.0
        if longer and self.share.chunk_may_run(bool(self.live)):  # rows that just joined count as decoding
            chunk_start = time.perf_counter()
            if self._prefill(longer[0], step[n], self.prefill_chunk):
                n += 1
            chunk_s = time.perf_counter() - chunk_start
            self.share.chunk_ran(chunk_s)
        if n:
            self._choose(step[:n])
        self.share.decoded(time.perf_counter() - started - chunk_s)

    def _prefill(self, s: Sequence, first: np.ndarray, budget: int | None) -> bool:
        """Feed ``s``'s prompt (its next ``budget`` tokens; None: all the rest), alone in its
        ``llama_decode`` calls (at most :data:`OUTPUT_BUDGET` logits rows each), scoring the question
        tokens each call predicts; once the prompt is in, copy its first token's logits into ``first``.

        A row's prompt is never batched with other sequences' tokens: llama.cpp's CPU attention
        gives different logits (up to ~1.0 on the embedded model) once a ubatch mixing sequences
        reaches 32 tokens (ggml-org/llama.cpp#24962), and each answer must not depend on its
        neighbours. Returns True when the row joined the batch, False while its prompt is still
        being fed or when it failed (its request gets the error).
        """
        import numpy as np

        ids = s.prepared.ids
        end = len(ids) if budget is None else min(len(ids), s.fed + budget)
        try:
            while s.fed < end:
                entries: list[tuple[int, int, int, bool]] = []
                outputs = 0
                while s.fed < end and len(entries) < self.model.n_batch:
                    p = s.fed
                    logits = p == len(ids) - 1 or p in s.kept
                    if logits and outputs >= OUTPUT_BUDGET:
                        break
                    outputs += logits
                    entries.append((ids[p], p, s.seq, logits))
                    s.fed += 1
                self.model.decode(entries)
                question: list[np.ndarray] = []
                for i, (_, p, _, logits) in enumerate(entries):
                    if logits and p in s.kept:
                        question.append(np.empty(self.model.n_vocab, dtype=np.float32))
                        self.model.logits_into(i, question[-1])
                    elif logits:
                        self.model.logits_into(i, first)
                self._score_question(s, [p for _, p, _, logits in entries if logits and p in s.kept], question)
            if s.fed < len(ids):
                return False
            s.pos = len(ids)
            self._join(s)
        except Exception as exc:  # handed to this request; the running rows go on
            self.admitted.remove(s)
            self._free(s)
            if not s.job.future.done():
                s.job.future.set_exception(exc)
            return False
        return True

    def _score_question(self, s: Sequence, positions: list[int], logits: list[np.ndarray]) -> None:
        """Score the question tokens predicted by the prompt ``positions`` (consecutive) whose ``logits``
        one call gave: scored at once, so a long question never holds ``tokens x vocabulary`` floats."""
        import numpy as np

        span = s.prepared.span
        part = span.part(positions[0] + 1, positions[-1] + 2) if positions and span is not None else None
        if part is not None:
            scores = prompt_scores(np.stack(logits), s.prepared.ids, part, self.scoring.k, self.scoring.evidence)
            s.prompt_scores = (*s.prompt_scores, *scores)

    def _join(self, s: Sequence) -> None:
        """``s``'s prompt is in the KV cache: it gets a recorder row."""
        self.admitted.remove(s)
        s.state = Row(stop=s.job.options.stop, limit=s.prepared.limit, cancel=s.job.cancel, grammar=s.prepared.grammar)
        self.live.append(s)
        self.recorder.rows.append(s.state)

    def _choose(self, step: np.ndarray) -> None:
        """Record the step's raw logits ``(rows, vocab)``, pick each row's next token, let the recorder end rows.

        Constrained rows choose among their grammar's tokens (a masked copy: the raw logits stay recorded).
        """
        record(self.recorder, step)
        if any(s.state is not None and s.state.grammar is not None for s in self.live):
            import numpy as np

            from logtoku_guard.tools.grammar import allowed_tokens

            allowed = allowed_tokens([s.state.grammar if s.state is not None else None for s in self.live], step.shape[-1])
            if allowed is not None:
                step = np.where(allowed, step, np.float32(-np.inf))
        if self.options.sampling and self.rng is not None:
            chosen = sample(self.recorder, step, self.options, self.rng)
        else:
            chosen = step.argmax(axis=-1).tolist()
        now = time.perf_counter()
        for s, token in zip(self.live, chosen, strict=True):
            s.last = int(token)
            if s.first_token_s is None:
                s.first_token_s = now - s.start
        self.recorder.step_tokens(chosen)

    def _leave(self) -> None:
        """Drop the rows that ended (or whose request already failed) from the batch.

        Their KV cells are not freed yet (:meth:`_admit` frees them when a waiting row needs the
        room): llama.cpp would place the live rows' next tokens in those cells, before their
        earlier ones, and its attention, summing over cells in cache order, would then give them
        different logits (up to ~0.5 on the embedded model) from those they get alone.
        """
        keep = [b for b, s in enumerate(self.live) if not (s.state is not None and s.state.done) and not s.job.future.done()]
        gone = [s for s in self.admitted if s.job.abandoned]
        for s in gone:
            self.admitted.remove(s)
            if not s.job.future.done():  # cancelled while its prompt was being fed: no tokens
                s.state = Row.cancelled(s.job, s.prepared.limit)
                self._complete(s, s.state)
        if len(keep) == len(self.live) and not gone:
            return
        kept = set(keep)
        for b, s in enumerate(self.live):
            if b not in kept:
                gone.append(s)
        self.ended.extend(gone)
        self.live = [self.live[b] for b in keep]
        self.recorder.rows = [self.recorder.rows[b] for b in keep]

    def _free(self, s: Sequence) -> None:
        self.model.forget(s.seq)
        self.free_seqs.append(s.seq)
