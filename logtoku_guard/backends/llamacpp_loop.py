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
   answer token). A prompt longer than ``prefill_chunk`` cannot stall the live rows: by default
   (``concurrent``) a thread of its own feeds it on a second llama.cpp context on the same weights
   (:meth:`~logtoku_guard.backends.llamacpp_model.LlamaModel.side_context`,
   :class:`~logtoku_guard.backends.chunked_prefill.Beside`), in the chunks of
   :func:`~logtoku_guard.backends.chunked_prefill.chunk_at`, while this loop goes on; once it is in,
   its KV cells are copied into the batch's context (exact:
   :meth:`~logtoku_guard.backends.llamacpp_model.LlamaContext.copy_sequence`) and it joins the batch.
   Else it is fed here, taking turns with the live rows, a chunk (or with ``prefill_budget_s``
   :class:`~logtoku_guard.backends.chunked_prefill.BudgetedPrefill`'s pieces) at a time.
   Rows never share a call with other
   sequences' prompt tokens: several prompts in one call changed a batched greedy answer, and
   merging them saved only a call's fixed cost (``benchmarks/README.md``). On weights that llama.cpp
   multiplies one row at a time (Q4_1 on x86) answers equal each one's alone bit for bit while the
   cells in use stay under 256 (past that, a row whose cells straddle llama.cpp's 256-cell boundary
   can get slightly different logits); on F16 (the embedded model's default) rows decoded together
   take llama.cpp's batched kernel, whose sums round otherwise (logits within about 0.002);
3. **choose**: the raw logits of every row (copied out with ``llama_get_logits_ith`` before
   the next decode overwrites them) form one ``(rows, vocab)`` float32 array, scored in numpy
   (:mod:`~logtoku_guard.backends.numpy_scoring`: top-K, log-normaliser, entropy; AU/EU by the
   recorder's :func:`~logtoku_guard.scoring.uncertainty.au_eu`), and the next token is
   chosen: arg-max for a greedy row; a sampled row draws with its own request's temperature
   (or the batch's dynamic schedule) and top-p, from its own random stream (seeded by
   :func:`~logtoku_guard.backends.batching.row_seed`), so greedy and sampled rows share a batch
   and a seeded row draws the same tokens whatever runs beside it;
4. **leave**: rows that ended drop their sequence from the KV cache; their requests complete.

Admission (a row joins only when its prompt and token limit fit the KV cells the live rows have not
reserved; a row that does not fit yet lets later ones around it without delaying it) is described in
:mod:`~logtoku_guard.backends.llamacpp_rows`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from logtoku_guard.backends.batching import Job, JobRows, PreparedRow, row_seed
from logtoku_guard.backends.chunked_prefill import (
    IDLE_POLL_S,
    Beside,
    BudgetedPrefill,
    FairShare,
    PrefillCost,
    chunk_at,
    plan,
)
from logtoku_guard.backends.llamacpp_rows import Sequence, prefill_steps, question_positions, shadow
from logtoku_guard.backends.numpy_scoring import prompt_scores, record, sample
from logtoku_guard.backends.recorder import Row, Scoring
from logtoku_guard.types import DecodingOptions, Generation

if TYPE_CHECKING:
    import numpy as np

    from logtoku_guard.backends.llamacpp_model import LlamaContext, LlamaModel, LlamaTokenizer

__all__ = ["DECODE_ROWS", "OUTPUT_BUDGET", "LlamaDecodeLoop"]

OUTPUT_BUDGET = 256
"""Most logits rows one ``llama_decode`` asks for (bounds llama.cpp's ``rows x vocabulary`` output buffer)."""
DECODE_ROWS = 16
"""Most rows decoded in one ``llama_decode`` (below the 32 tokens at which a ubatch mixing
sequences changes llama.cpp's CPU attention results: ggml-org/llama.cpp#24962)."""


class LlamaDecodeLoop(JobRows):
    """Runs one continuous batch on a :class:`~logtoku_guard.backends.llamacpp_model.LlamaModel`.

    Args:
        model, tokenizer: the llama.cpp model (its context) and vocabulary.
        scoring: what is recorded of each step.
        options: the batch's decoding settings (``max_new_tokens`` and ``stop`` are per row).
        take_joiners: the batcher's :meth:`~logtoku_guard.backends.batching.Batcher.take_joiners`.
        finish: builds a row's :class:`~logtoku_guard.types.Generation` when it ends.
        max_rows: sequences available (the context's ``n_seq_max``).
        prefill_chunk: a prompt of more tokens is fed over several steps
            (:mod:`~logtoku_guard.backends.chunked_prefill`; None: every prompt whole).
        prefill_budget_s: seconds a step may spend on a long prompt's pieces
            (:class:`~logtoku_guard.backends.chunked_prefill.BudgetedPrefill`); None: one chunk of
            :func:`~logtoku_guard.backends.chunked_prefill.chunk_at` tokens a step.
        prefill_cost: the backend's running estimate of a prompt token's cost (kept across loops).
        concurrent: a prompt longer than ``prefill_chunk`` is prefilled on the model's side context
            by a thread of its own while the batch decodes
            (:class:`~logtoku_guard.backends.chunked_prefill.Beside`; its chunks are those
            of :func:`~logtoku_guard.backends.chunked_prefill.chunk_at`, so its scores are the same
            bits as fed here); False feeds it here, taking turns with the live rows.
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
        prefill_budget_s: float | None = None,
        prefill_cost: PrefillCost | None = None,
        concurrent: bool = False,
    ) -> None:
        self.model = model
        self.concurrent = concurrent and prefill_chunk is not None
        self.side: Beside[Sequence] | None = None  # the long prompt being prefilled on the side context
        self.side_first: np.ndarray | None = None  # its first answer token's logits, once its prompt is in
        self.hold = False  # admit nothing new until the side row's cells fit (see _side_join)
        self.prefill_chunk = prefill_chunk
        self.budgeted = BudgetedPrefill(prefill_budget_s, prefill_cost) if prefill_budget_s and prefill_chunk else None
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
        self.bypassed = 0
        """Rows admitted while an earlier one waited for KV cells (for tests and benchmarks)."""

    # -- the loop ------------------------------------------------------------------------------
    def run(self, jobs: list[Job]) -> None:
        """Generate ``jobs`` and every job that joins; each job's future completes as its rows end."""
        self._queue(jobs)
        try:
            while self.live or self.admitted or self.waiting:
                self._admit()
                self._step()
                self._leave()
                rows = len(self.live) + len(self.admitted) + len(self.waiting)
                self._queue(self.take_joiners(rows))
                side = self.side  # no live row: the rows admitted wait for the side prefill (short ones joined)
                if side is not None and not self.live and not side.done.is_set():
                    side.done.wait(IDLE_POLL_S)  # only the side prefill runs: look for new requests now and then
        finally:
            self._stop_side()
            self.model.clear()

    def _queue(self, jobs: list[Job]) -> None:
        self.waiting.extend((job, i, p) for job in jobs for i, p in enumerate(job.rows))

    def _admit(self) -> None:
        """Admit waiting rows, first come first served, while a sequence and their KV cells are free.

        A row that does not fit now waits without blocking the rows behind it: a later row that fits
        is admitted if it ends before the first waiting row is sure to fit, or fits in the cells
        spare beside it then (:func:`shadow`). The cells of rows that ended stay in use until a
        waiting row needs them (:meth:`_leave`); then all of them are freed at once.
        """
        import numpy as np

        chunk = self.prefill_chunk
        used = sum(s.reserved for s in (*self.live, *self.admitted))
        reserve: tuple[int, int] | None = None  # (steps, spare cells) of the first row that does not fit
        i = 0
        while i < len(self.waiting):
            job, index, p = self.waiting[i]
            if job.future.done():  # failed or already answered: nothing to generate
                self.waiting.pop(i)
                continue
            need = len(p.ids) + p.limit
            ended = sum(s.pos for s in self.ended)
            if self.ended and (not self.free_seqs or used + ended + need > self.model.n_ctx):
                for s in self.ended:
                    self._free(s)
                self.ended = []
                continue
            if not self.free_seqs or self.hold:
                return
            running = self.live or self.admitted
            if running and used + need > self.model.n_ctx:  # waits; the rows behind it may go around it
                if reserve is None:
                    pieces = self.budgeted is not None
                    rows = [(s.reserved, s.steps_left(chunk, pieces)) for s in (*self.live, *self.admitted)]
                    reserve = shadow(rows, self.model.n_ctx - used, need)
                i += 1
                continue
            if reserve is not None:
                steps, spare = reserve
                if prefill_steps(len(p.ids), 0, chunk, self.budgeted is not None) + p.limit > steps:
                    if need > spare:
                        i += 1  # it would delay the first waiting row
                        continue
                    reserve = (steps, spare - need)
                self.bypassed += 1
            self.waiting.pop(i)
            used += need
            seed = row_seed(job.options.seed, index)
            rng = np.random.default_rng(seed) if job.options.sampling else None
            self.admitted.append(
                Sequence(job, index, p, self.free_seqs.pop(0), time.perf_counter(), question_positions(p), rng=rng)
            )

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
        whole, longer = plan([(s, len(s.prepared.ids) - s.fed, s.fed) for s in self.admitted], self.prefill_chunk)
        for s in whole:
            if self._prefill(s, step[n], None):
                n += 1
        chunk_s = 0.0
        if longer and self.concurrent:
            if self._side_step(longer[0], step[n]):
                n += 1
        elif longer and self.share.chunk_may_run(bool(self.live)):  # rows that just joined count as decoding
            chunk_start = time.perf_counter()
            if self._feed_long(longer[0], step[n]):
                n += 1
            chunk_s = time.perf_counter() - chunk_start
            self.share.chunk_ran(chunk_s)
        if n:
            self._choose(step[:n])
        self.share.decoded(time.perf_counter() - started - chunk_s)

    def _feed_long(self, s: Sequence, first: np.ndarray) -> bool:
        """This step's share of the long prompt ``s``: pieces within the time budget, or one chunk.
        Returns True when its prompt is in and the row joined the batch."""
        if self.budgeted is None:
            return self._prefill(s, first, chunk_at(s.fed, self.prefill_chunk))
        joined = False

        def feed(n: int) -> bool:
            nonlocal joined
            joined = self._prefill(s, first, n)
            return not joined and s in self.admitted and not s.job.abandoned  # a cancelled prompt stops here

        self.budgeted.turn(s.fed, len(s.prepared.ids), feed)
        return joined

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
        ids = s.prepared.ids
        end = len(ids) if budget is None else min(len(ids), s.fed + budget)
        try:
            self._feed(self.model, s, first, end)
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

    def _feed(self, ctx: LlamaContext, s: Sequence, first: np.ndarray, end: int) -> None:
        """Feed ``s``'s prompt up to position ``end`` into ``ctx`` (calls of at most
        :data:`OUTPUT_BUDGET` logits rows), scoring the question tokens each call predicts and
        copying the last prompt position's logits (the first answer token's) into ``first``."""
        ids = s.prepared.ids
        while s.fed < end:
            entries: list[tuple[int, int, int, bool]] = []
            outputs = 0
            while s.fed < end and len(entries) < ctx.n_batch:
                p = s.fed
                logits = p == len(ids) - 1 or p in s.kept
                if logits and outputs >= OUTPUT_BUDGET:
                    break
                outputs += logits
                entries.append((ids[p], p, s.seq, logits))
                s.fed += 1
            ctx.decode(entries)
            at = [i for i, (_, p, _, logits) in enumerate(entries) if logits and p in s.kept]
            for i, (_, p, _, logits) in enumerate(entries):
                if logits and p not in s.kept:
                    ctx.logits_into(i, first)
            # The question's rows are read in place (llama.cpp's buffer, valid until the next decode): no copies.
            self._score_question(s, [entries[i][1] for i in at], ctx.logits_rows(at))

    # -- a long prompt's concurrent prefill ----------------------------------------------------
    def _side_step(self, s: Sequence, first: np.ndarray) -> bool:
        """Start ``s``'s prefill on the side context, or, once it is in, move it into the batch.
        Returns True when ``s`` joined the batch this step (its first token's logits in ``first``)."""
        import numpy as np

        side = self.side
        if side is None:
            ctx = self.model.side_context()
            ctx.forget(s.seq)
            out = self.side_first = np.empty(self.model.n_vocab, dtype=np.float32)
            n = len(s.prepared.ids)

            def chunk() -> bool:
                self._feed(ctx, s, out, min(n, s.fed + (chunk_at(s.fed, self.prefill_chunk) or n)))
                return s.fed < n

            self.side = Beside(s, chunk, lambda: s.job.abandoned, "logtoku-llamacpp-prefill")
            return False
        if side.row is not s or not side.done.is_set():
            return False
        return self._side_join(side, first)

    def _side_join(self, side: Beside[Sequence], first: np.ndarray) -> bool:
        """The side prefill of ``side.row`` ended: fail or cancel its request, or copy its KV cells into
        the batch's context and let it join (True).

        llama.cpp places a copied sequence's cells side by side; when the batch's cache has no run of
        free cells that long (the rows' cells interleave as they decode), the cells of rows that ended
        are freed and the copy is tried again; if it still does not fit, no new row is admitted
        (:attr:`hold`) until it does, which it will once enough live rows end (each ends by its limit).
        """
        s = side.row
        ctx = self.model.side_context()
        if side.error is not None or s.job.abandoned or s.fed < len(s.prepared.ids):
            self.side = None
            self.hold = False
            ctx.forget(s.seq)
            self.admitted.remove(s)
            if side.error is not None:
                self._free(s)
                if not s.job.future.done():
                    s.job.future.set_exception(side.error)
            else:  # cancelled while its prompt was being fed: no tokens
                s.state = Row.cancelled(s.job, s.prepared.limit)
                self._complete(s, s.state)
                self.ended.append(s)
            return False
        copied = self.model.copy_sequence(ctx, s.seq)
        if not copied and self.ended:
            for e in self.ended:
                self._free(e)
            self.ended = []
            copied = self.model.copy_sequence(ctx, s.seq)
        if not copied:
            self.hold = True
            return False
        ctx.forget(s.seq)
        self.side = None
        self.hold = False
        if self.side_first is not None:
            first[:] = self.side_first
        s.pos = len(s.prepared.ids)
        self._join(s)
        return True

    def _stop_side(self) -> None:
        """Stop the side prefill, if one runs (at the end of its chunk), and wait for its thread."""
        side = self.side
        if side is None:
            return
        side.finish()
        self.side = None
        self.model.side_context().clear()

    def _score_question(self, s: Sequence, positions: list[int], logits: np.ndarray) -> None:
        """Score the question tokens predicted by the prompt ``positions`` (consecutive) whose ``logits``
        one call gave (``(len(positions), vocab)``): scored at once, so a long question never holds
        ``tokens x vocabulary`` floats."""
        span = s.prepared.span
        part = span.part(positions[0] + 1, positions[-1] + 2) if positions and span is not None else None
        if part is not None:
            scores = prompt_scores(logits, s.prepared.ids, part, self.scoring.k, self.scoring.evidence)
            s.prompt_scores = (*s.prompt_scores, *scores)

    def _join(self, s: Sequence) -> None:
        """``s``'s prompt is in the KV cache: it gets a recorder row."""
        self.admitted.remove(s)
        s.state = Row(
            stop=s.job.options.stop,
            model_stop=s.job.model_stop,
            limit=s.prepared.limit,
            cancel=s.job.cancel,
            grammar=s.prepared.grammar,
        )
        self.live.append(s)
        self.recorder.rows.append(s.state)

    def _choose(self, step: np.ndarray) -> None:
        """Record the step's raw logits ``(rows, vocab)``, pick each row's next token, let the recorder end rows.

        Constrained rows choose among their grammar's tokens (a masked copy: the raw logits stay recorded).
        """
        record(self.recorder, step)
        if any(s.job.options.logit_params for s in self.live):
            step = self._penalise(step)
        if any(s.state is not None and s.state.grammar is not None for s in self.live):
            import numpy as np

            from logtoku_guard.tools.grammar import allowed_tokens

            allowed = allowed_tokens([s.state.grammar if s.state is not None else None for s in self.live], step.shape[-1])
            if allowed is not None:
                step = np.where(allowed, step, np.float32(-np.inf))
        chosen = step.argmax(axis=-1).tolist()
        sampled = [b for b, s in enumerate(self.live) if s.rng is not None]
        if sampled:
            self._sample(step, sampled, chosen)
        now = time.perf_counter()
        for s, token in zip(self.live, chosen, strict=True):
            s.last = int(token)
            if s.first_token_s is None:
                s.first_token_s = now - s.start
        self.recorder.step_tokens(chosen)

    def _sample(self, step: np.ndarray, sampled: list[int], chosen: list[int]) -> None:
        """Each sampled row's token in ``chosen``: drawn with its own request's settings and random stream."""
        import numpy as np

        temperatures: list[float] | None = None
        if self.options.dynamic is not None:  # the batch's schedule, every row's (its jobs share it)
            pending = self.recorder.pending
            if pending is None:
                msg = "internal error: sampling before the step's logits were recorded"
                raise RuntimeError(msg)
            temperatures = [self.options.dynamic.temperature(e) for e in self.recorder.au_eu(pending)[1]]
            self.recorder.record_temperatures(np.asarray(temperatures, dtype=np.float64))  # type: ignore[arg-type]
        for b in sampled:
            s = self.live[b]
            options = s.job.options
            if temperatures is not None:
                options = DecodingOptions(temperature=temperatures[b], top_p=options.top_p)
            if s.rng is not None:
                chosen[b] = sample(self.recorder, step[b : b + 1], options, s.rng)[0]

    def _penalise(self, step: np.ndarray) -> np.ndarray:
        """A copy of the step's logits with each row's request logit bias and penalties applied
        (:func:`~logtoku_guard.backends.processors.penalise_row`; the raw logits are already recorded)."""
        import numpy as np

        from logtoku_guard.backends.processors import penalise_row

        out = np.array(step, copy=True)
        for b, s in enumerate(self.live):
            if s.job.options.logit_params and s.state is not None:
                answer = [t.id for t in s.state.tokens] + [t.id for t in s.state.held]
                out[b] = penalise_row(step[b], answer, s.job.options)
        return out

    def _leave(self) -> None:
        """Drop the rows that ended (or whose request already failed) from the batch.

        Their KV cells are not freed yet (:meth:`_admit` frees them when a waiting row needs the
        room): llama.cpp would place the live rows' next tokens in those cells, before their
        earlier ones, and its attention, summing over cells in cache order, would then give them
        different logits (up to ~0.5 on the embedded model) from those they get alone.
        """
        keep = [b for b, s in enumerate(self.live) if not (s.state is not None and s.state.done) and not s.job.future.done()]
        side = self.side.row if self.side is not None else None  # ends in _side_join, once its thread stops
        gone = [s for s in self.admitted if s.job.abandoned and s is not side]
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
