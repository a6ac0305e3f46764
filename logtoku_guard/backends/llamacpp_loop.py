"""Continuous batching on llama.cpp: each batch row is a llama.cpp sequence of one shared KV cache.

:class:`LlamaDecodeLoop` is the llama.cpp counterpart of
:class:`~logtoku_guard.backends.decode_loop.DecodeLoop`, driven by the same
:class:`~logtoku_guard.backends.batching.Batcher` and scoring with the same
:class:`~logtoku_guard.backends.recorder.StepRecorder`. Each step builds one ``llama_batch``:

1. **decode**: one token for each live row (its last token, at its next position, in its own
   sequence), each asking for logits;
2. **prefill**: then the prompt tokens of rows being admitted, FCFS, as many as the step's
   budget allows (:data:`OUTPUT_BUDGET` logits rows, the batch's token capacity); a long
   prompt is prefilled over several steps (chunked prefill). Logits are asked for at the
   positions that predict the question's tokens (its prompt-side scores,
   :func:`~logtoku_guard.backends.prompt_capture.score_kept`) and at its last position (its
   first answer token);
3. **choose**: one ``llama_decode``; the raw logits of every row that has a next token are
   copied out (``llama_get_logits_ith``: valid only until the next decode) into one
   ``(rows, vocab)`` float32 array, recorded (top-K, AU/EU, entropy: the recorder's maths),
   and the next token is chosen (arg-max, or temperature / top-p sampling in torch);
4. **leave**: rows that ended drop their sequence from the KV cache; their requests complete.

A row is admitted only when its prompt plus its token limit fits in the KV cells the live rows
have not reserved, so a running batch never runs out of cache; a request alone always fits
(its limit is clamped to the context when it is prepared).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.batching import Job
from logtoku_guard.backends.decode_loop import PreparedRow, Scoring
from logtoku_guard.backends.prompt_capture import score_kept
from logtoku_guard.backends.recorder import Row, StepRecorder
from logtoku_guard.types import DecodingOptions, Generation, TokenScore

if TYPE_CHECKING:
    import numpy as np
    import torch

    from logtoku_guard.backends.llamacpp_model import LlamaModel, LlamaTokenizer

__all__ = ["OUTPUT_BUDGET", "LlamaDecodeLoop", "Sequence"]

OUTPUT_BUDGET = 256
"""Most logits rows one step asks llama.cpp for (bounds its ``rows x vocabulary`` output buffer)."""


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
    prompt_logits: list[np.ndarray] = field(default_factory=list)
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


class LlamaDecodeLoop:
    """Runs one continuous batch on a :class:`~logtoku_guard.backends.llamacpp_model.LlamaModel`.

    Args:
        model, tokenizer: the llama.cpp model (its context) and vocabulary.
        scoring: what is recorded of each step.
        options: the batch's decoding settings (``max_new_tokens`` and ``stop`` are per row).
        take_joiners: the batcher's :meth:`~logtoku_guard.backends.batching.Batcher.take_joiners`.
        finish: builds a row's :class:`~logtoku_guard.types.Generation` when it ends.
        max_rows: sequences available (the context's ``n_seq_max``).
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
    ) -> None:
        self.model = model
        self.scoring = scoring
        self.options = options
        self.take_joiners = take_joiners
        self.finish = finish
        self.free_seqs = list(range(max_rows))
        self.live: list[Sequence] = []  # rows with a recorder row, in recorder order
        self.admitted: list[Sequence] = []  # rows being prefilled, FCFS
        self.waiting: list[tuple[Job, int, PreparedRow]] = []
        self.results: dict[Job, dict[int, Generation]] = {}
        self.recorder = StepRecorder(
            k=scoring.k,
            evidence=scoring.evidence,
            tokenizer=tokenizer,
            rows=[],
            stop=(),
            eos_ids=scoring.eos_ids,
            on_token=self._on_token,
            cancel=None,
            max_logprobs=scoring.max_logprobs,
            on_row_done=self._on_row_done,
        )
        self.generator: torch.Generator | None = None

    # -- the loop ------------------------------------------------------------------------------
    def run(self, jobs: list[Job]) -> None:
        """Generate ``jobs`` and every job that joins; each job's future completes as its rows end."""
        import torch

        if self.options.sampling and self.options.seed is not None:
            self.generator = torch.Generator().manual_seed(self.options.seed)
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
        """Admit waiting rows, first come first served, while a sequence and their KV cells are free."""
        used = sum(s.reserved for s in (*self.live, *self.admitted))
        while self.waiting and self.free_seqs:
            job, i, p = self.waiting[0]
            if job.future.done():  # failed or already answered: nothing to generate
                self.waiting.pop(0)
                continue
            need = len(p.ids) + p.limit
            if used + need > self.model.n_ctx and (self.live or self.admitted):
                return
            self.waiting.pop(0)
            used += need
            self.admitted.append(Sequence(job, i, p, self.free_seqs.pop(0), time.perf_counter(), question_positions(p)))

    def _step(self) -> None:
        """One ``llama_decode``: the live rows' next tokens and a budget of prompt tokens; then choose."""
        import numpy as np

        entries: list[tuple[int, int, int, bool]] = [(s.last, s.pos, s.seq, True) for s in self.live]
        outputs = len(entries)
        # each admitted row fed this step: (row, (batch entry, prompt position) of each logits row asked)
        fed: list[tuple[Sequence, list[tuple[int, int]]]] = []
        for s in self.admitted:
            ids = s.prepared.ids
            wanted: list[tuple[int, int]] = []
            start = s.fed
            while s.fed < len(ids) and len(entries) < self.model.n_batch:
                p = s.fed
                logits = p == len(ids) - 1 or p in s.kept
                if logits and outputs >= OUTPUT_BUDGET and entries:
                    break
                if logits:
                    outputs += 1
                    wanted.append((len(entries), p))
                entries.append((ids[p], p, s.seq, logits))
                s.fed += 1
            if s.fed > start:
                fed.append((s, wanted))
            if s.fed < len(ids):
                break  # the budget is spent: the rows after it wait for the next step
        self.model.decode(entries)
        for s in self.live:
            s.pos += 1
        rows = list(range(len(self.live)))  # batch entry of each row's next-token logits, in recorder order
        vocab = self.model.n_vocab
        for s, wanted in fed:
            s.pos = s.fed
            last = len(s.prepared.ids) - 1
            for entry, p in wanted:
                if p in s.kept:
                    buf = np.empty(vocab, dtype=np.float32)
                    self.model.logits_into(entry, buf)
                    s.prompt_logits.append(buf)
                if p == last:
                    rows.append(entry)
                    self._join(s)
        if not rows:
            return
        step = np.empty((len(rows), vocab), dtype=np.float32)
        for r, entry in enumerate(rows):
            self.model.logits_into(entry, step[r])
        self._choose(step)

    def _join(self, s: Sequence) -> None:
        """``s``'s prompt is in the KV cache: score its question and give it a recorder row."""
        import numpy as np
        import torch

        self.admitted.remove(s)
        span = s.prepared.span
        if s.kept and span is not None:
            logits = torch.from_numpy(np.stack(s.prompt_logits))
            ids = torch.tensor(s.prepared.ids, dtype=torch.long)
            s.prompt_scores = score_kept(logits, list(s.kept), ids, span, self.scoring.k, self.scoring.evidence)
        s.prompt_logits = []
        s.state = Row(stop=s.job.options.stop, limit=s.prepared.limit, cancel=s.job.cancel)
        self.live.append(s)
        self.recorder.rows.append(s.state)

    def _choose(self, step: np.ndarray) -> None:
        """Record the step's raw logits ``(rows, vocab)``, pick each row's next token, let the recorder end rows."""
        import torch

        logits = torch.from_numpy(step)
        self.recorder.record(logits)
        if self.options.sampling:
            chosen = self._sample(logits)
        else:
            chosen = torch.argmax(logits, dim=-1)
        now = time.perf_counter()
        for s, token in zip(self.live, chosen.tolist(), strict=True):
            s.last = int(token)
            if s.first_token_s is None:
                s.first_token_s = now - s.start
        self.recorder(chosen[:, None])

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        """Sample each row: dynamic or fixed temperature, then top-p (as transformers' warpers do)."""
        import torch

        options = self.options
        if options.dynamic is not None:
            temperatures = options.dynamic.temperatures(self.recorder.current_eu())
            self.recorder.record_temperatures(temperatures)
            scores = logits / temperatures[:, None]
        else:
            scores = logits / float(options.temperature)
        if options.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False, dim=-1)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - options.top_p)
            remove[:, -1] = False  # keep at least the likeliest token
            scores = scores.masked_fill(remove.scatter(1, order, remove), -float("inf"))
        probs = torch.softmax(scores, dim=-1)
        broken = ~torch.isfinite(probs).all(dim=-1)
        if bool(broken.any()):  # non-finite logits: the recorder ends these rows with the error
            probs = probs.masked_fill(broken[:, None], 1.0)
        return torch.multinomial(probs, num_samples=1, generator=self.generator).squeeze(1)

    def _leave(self) -> None:
        """Drop the rows that ended (or whose request already failed); free their sequences."""
        keep = [b for b, s in enumerate(self.live) if not (s.state is not None and s.state.done) and not s.job.future.done()]
        gone = [s for s in self.admitted if s.job.future.done()]
        for s in gone:
            self.admitted.remove(s)
        if len(keep) == len(self.live) and not gone:
            return
        kept = set(keep)
        for b, s in enumerate(self.live):
            if b not in kept:
                gone.append(s)
        for s in gone:
            self.model.forget(s.seq)
            self.free_seqs.append(s.seq)
        self.live = [self.live[b] for b in keep]
        self.recorder.rows = [self.recorder.rows[b] for b in keep]

    # -- the recorder's callbacks ----------------------------------------------------------------
    def _on_token(self, b: int, token: TokenScore) -> None:
        s = self.live[b]
        if s.job.on_token is not None and not s.job.future.done():
            s.job.on_token(s.index, token)

    def _on_row_done(self, b: int, state: Row) -> None:
        s = self.live[b]
        job = s.job
        if job.future.done():
            return
        if state.error is not None:
            job.future.set_exception(state.error)
            return
        done = self.results.setdefault(job, {})
        done[s.index] = self.finish(s)
        if len(done) == len(job.rows):
            del self.results[job]
            job.future.set_result([done[n] for n in range(len(job.rows))])

