"""The step recorder: raw top-K capture, token scoring and stop strings, one step at a time.

:class:`StepRecorder` is driven by the backend's decode loop
(:mod:`logtoku_guard.backends.decode_loop`), with the interface of a forward hook and a
stopping criterion of transformers' ``generate``. :meth:`StepRecorder.record` (the hook reads
``outputs.logits[:, -1]``) takes each step's raw logits, *before* any logits processor
(repetition penalty, temperature, top-k/p...) touches them, and keeps only what LogTokU
needs (:class:`StepScores`, Python lists): the top-K values and ids (:func:`top_k`), the
full-softmax entropy and its log-normaliser (:func:`lse_entropy`) and, for one step only, the
raw row from which the chosen token's logit is read when it is not among the top ids (its
log-probability is that logit minus the normaliser). The stopping criterion (called once per
step, right after the token is chosen) pairs the chosen token with that step's scores (AU and
EU of the step's rows in one call, :func:`~logtoku_guard.scoring.uncertainty.token_logtoku`), detokenizes it
(:mod:`logtoku_guard.backends.detokenizer`), handles stop strings and streams the token
out. Memory grows with steps x K, never with steps x vocabulary.

Per-step cost: inside a decoding step every tensor operation costs tens of microseconds,
whatever its size, because the output head's product just before has evicted the caches; the
scoring therefore runs as few tensor operations as it can (about ten per step) and does the
per-row arithmetic on Python floats after a few ``tolist`` (``benchmarks/bench_scoring.py``).

Stop strings are cut by :mod:`~logtoku_guard.backends.stop_strings` (shared with the scripted
backend, so both cut an answer the same way). No torch import at module level.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.detokenizer import IncrementalDetokenizer
from logtoku_guard.backends.stop_strings import held_stop
from logtoku_guard.errors import GrammarError, NonFiniteLogitsError
from logtoku_guard.scoring.uncertainty import EvidenceMode, logsumexp_entropy, lse_entropy_of, token_logtoku
from logtoku_guard.types import FinishReason, TokenScore

if TYPE_CHECKING:
    import torch


TOP_K_CHUNK = 64
LOG2E = 1.0 / math.log(2.0)
"""``log2 e``: ``exp(x) = exp2(x * LOG2E)``."""


def top_k(logits: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    """``logits.topk(k, dim=-1)`` of ``(batch, vocab)`` logits as Python lists, in about one pass.

    ``torch.topk`` over a whole vocabulary costs several times a plain reduction on CPU. The
    vocabulary is cut into chunks of :data:`TOP_K_CHUNK`; the top ``k`` values lie in the
    ``k`` chunks with the largest maxima (a chunk outside them has ``k`` larger chunk maxima
    above its own, hence ``k`` larger values), so one ``amax`` per chunk, a top-K over the
    chunk maxima and one over ``k`` chunks (plus the vocabulary's tail) give the same values
    and ids (ids of exactly equal values may be another of the equal ones). The ids are put
    together in Python from the chunks' and the positions' lists: inside a decoding step, right
    after the output head's product has evicted the caches, each tensor operation costs tens
    of microseconds of dispatch whatever its size, more than this arithmetic on ``k`` ints.
    Returns ``(values, ids)``, each ``batch`` lists of ``k`` (largest first).
    """
    import torch

    rows, vocab = logits.shape
    n = vocab // TOP_K_CHUNK
    if n <= k:
        top = logits.topk(k, dim=-1)
        return top.values.tolist(), top.indices.tolist()
    width = n * TOP_K_CHUNK
    head = logits[:, :width].reshape(rows, n, TOP_K_CHUNK) if width < vocab else logits.reshape(rows, n, TOP_K_CHUNK)
    _, chunks = head.amax(dim=-1).topk(k, dim=-1)  # (rows, k)
    cand = head.gather(1, chunks.unsqueeze(-1).expand(rows, k, TOP_K_CHUNK)).view(rows, k * TOP_K_CHUNK)
    if width < vocab:
        cand = torch.cat([cand, logits[:, width:]], dim=1)
    values, pos = cand.topk(k, dim=-1)
    span = k * TOP_K_CHUNK  # candidate positions from here on are the tail's
    ids = [
        [c[p // TOP_K_CHUNK] * TOP_K_CHUNK + p % TOP_K_CHUNK if p < span else width + p - span for p in ps]
        for c, ps in zip(chunks.tolist(), pos.tolist())
    ]
    return values.tolist(), ids


SHIFT_FREE = 64.0
"""Row maxima within ``+-SHIFT_FREE``: :func:`lse_entropy` takes ``exp(z)`` without subtracting them."""


def lse_entropy(
    logits: torch.Tensor, top: Sequence[float], scratch: torch.Tensor | None = None
) -> tuple[list[float], list[float]]:
    """``logsumexp`` and softmax entropy of ``(batch, vocab)`` float32 logits whose row maxima are ``top``.

    The scoring cost of a step beyond its one top-K: one exponential ``e`` written in place,
    its sum ``s`` and the sum of ``e * z`` (``d``): ``logsumexp = log s`` and ``entropy =
    logsumexp - d / s`` (three passes over the vocabulary instead of the seven of a separate
    logsumexp and ``p * z``). The exponential is taken as ``exp2(z * log2 e)``: torch's CPU
    ``exp2`` kernel is about 3x faster than its ``exp`` (float32 error ~1e-6, as before). It is
    shifted by the row maximum (``exp(z - max)``, ``logsumexp = max + log s``) only when a
    maximum lies beyond ``+-``:data:`SHIFT_FREE`: below, neither ``s`` nor ``d`` can overflow
    float32 and the maximum's term is a normal float, so both ways give the same result to
    float32 rounding, and the unshifted one is a tensor operation fewer. ``scratch``, a
    float32 tensor of the logits' shape, receives the exponentials: a decoding loop passes the
    same one at every step (:func:`scratch_for`), which spares a fresh vocabulary-sized
    allocation (and its page faults, the larger cost at batch 8 on CPU) per step.

    Inside a decoding step each tensor operation costs tens of microseconds whatever its size
    (the output head's product just before has evicted the caches), so the per-row arithmetic
    is done on Python floats after two ``tolist``, by the library's one
    :func:`~logtoku_guard.scoring.uncertainty.lse_entropy_of`. Rows with masked (-inf) or
    non-finite logits: every row falls back to
    :func:`~logtoku_guard.scoring.uncertainty.logsumexp_entropy`. Returns ``(lse, entropy)``, each a
    list of ``batch`` floats.
    """
    import torch

    if all(-SHIFT_FREE <= t <= SHIFT_FREE for t in top):  # False for NaN and infinities
        shift: Sequence[float] = [0.0] * len(top)
        e = torch.mul(logits, LOG2E, out=scratch) if scratch is not None else logits * LOG2E
    else:
        shift = top
        bias = torch.tensor([[-t * LOG2E] for t in top], dtype=logits.dtype, device=logits.device)
        e = torch.add(bias, logits, alpha=LOG2E, out=scratch) if scratch is not None else torch.add(bias, logits, alpha=LOG2E)
    e.exp2_()
    sums = e.sum(dim=-1).tolist()
    dots = e.mul_(logits).sum(dim=-1).tolist()  # sum(e * z); lse_entropy_of takes sum(e * (z - shift))
    lse, entropy = lse_entropy_of(shift, sums, [d - m * s for m, s, d in zip(shift, sums, dots)])
    if any(map(math.isnan, entropy)):  # masked (-inf) or non-finite logits: the exact pass, for every row
        exact = logsumexp_entropy(logits)
        return exact[0].tolist(), exact[1].tolist()
    return lse, entropy


def scratch_for(scratch: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
    """``scratch`` when it fits ``logits`` (shape, dtype, device), else a new buffer that does."""
    import torch

    if scratch is None or scratch.shape != logits.shape or scratch.dtype != logits.dtype or scratch.device != logits.device:
        return torch.empty_like(logits)
    return scratch


@dataclass
class StepScores:
    """One decoding step's scores, waiting for the chosen token (Python lists, one item per row).

    ``values``/``ids``: per row, the ``max(K, max_logprobs)`` raw top logits (largest first,
    float32 values) and their token ids (AU/EU read the first K); ``au``/``eu``/``lse``/``entropy``:
    one float per row (``au``/``eu`` None until asked for, by the criterion or the dynamic
    temperature); ``logits``: the ``(batch, vocab)`` tensor of
    this step's raw rows, kept only until the token is chosen (the chosen token's logit is read
    from it when that token is not among the top ids).
    """

    values: list[list[float]]
    ids: list[list[int]]
    au: list[float] | None
    eu: list[float] | None
    logits: Any  # torch.Tensor, or a numpy array (the llama.cpp backend)
    lse: list[float]
    entropy: list[float]


@dataclass
class Row:
    """Decoding state of one batch row: emitted tokens and those held back for stop strings.

    A row may carry its own settings (a batch of independent requests): ``stop`` strings (and
    ``model_stop``, the model's own: :mod:`~logtoku_guard.backends.stop_strings`),
    ``limit`` (its ``max_new_tokens``; None: the batch's) and ``cancel`` (ends this row only).
    ``error`` is set, and the row closed, when its logits are not finite and the recorder
    isolates rows (``on_row_done`` given): the other rows go on. ``grammar``: a constrained row's grammar.
    """

    detokenizer: IncrementalDetokenizer = field(default_factory=IncrementalDetokenizer)
    held: list[TokenScore] = field(default_factory=list)
    tokens: list[TokenScore] = field(default_factory=list)
    done: bool = False
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None
    stop: tuple[str, ...] = ()
    model_stop: tuple[str, ...] = ()  # the model's own, looked for after the answer's leading whitespace
    limit: int | None = None
    cancel: threading.Event | None = None
    error: BaseException | None = None
    grammar: Any = None

    @classmethod
    def cancelled(cls, job: Any, limit: int) -> Row:
        """The end state of a ``job``'s row cancelled before its first token: no tokens, ``"cancelled"``."""
        return cls(stop=job.options.stop, limit=limit, cancel=job.cancel, done=True, finish_reason="cancelled")


class StepRecorder:
    """Forward hook + stopping criterion: one record per row per step, no vocab-sized history.

    Row ``b`` of each step's logits and chosen tokens is ``rows[b]``. The decode loop of a
    continuous batch edits ``rows`` between steps (rows appended as requests join, removed
    as they leave) so that it always lists the live rows in batch order.

    Args:
        k: top-K logits kept per token.
        evidence: ``"clamped"`` or ``"raw"`` (see :func:`~logtoku_guard.scoring.uncertainty.logtoku`).
        tokenizer: the model's tokenizer (only ``decode`` is used).
        rows: batch size, or the rows themselves (each with its own stop strings, token
            limit and cancel event: a batch of independent requests).
        stop: stop strings of every row given by count; text is held back while it could
            still begin one.
        eos_ids: token ids that end a row (never emitted as tokens).
        on_token: called with ``(row, token)`` as each token is released.
        cancel: when set, every row ends with ``finish_reason == "cancelled"`` after this step.
        max_logprobs: raw top logits kept per token for ``top_logprobs`` (``alt_logits``;
            only when larger than ``k``); AU/EU always read the first ``k``.
        on_row_done: called with ``(row index, row)`` as soon as a row ends (EOS, stop string,
            its limit, its cancel event, or an error), so that its request can complete while
            the batch goes on; rows still open when generation stops are not reported (see
            :meth:`finish_row`). When given, non-finite logits end their row with ``error``
            set instead of raising for the whole batch.
    """

    def __init__(
        self,
        *,
        k: int,
        evidence: EvidenceMode,
        tokenizer: Any,
        rows: int | Sequence[Row],
        stop: tuple[str, ...],
        eos_ids: frozenset[int],
        on_token: Callable[[int, TokenScore], None] | None,
        cancel: threading.Event | None,
        max_logprobs: int = 0,
        on_row_done: Callable[[int, Row], None] | None = None,
    ) -> None:
        self.k = k
        self.width = max(k, max_logprobs)
        self.evidence = evidence
        self.tokenizer = tokenizer
        self.rows = [Row(stop=stop) for _ in range(rows)] if isinstance(rows, int) else list(rows)
        self.stop = stop
        self.on_row_done = on_row_done
        self.eos_ids = eos_ids
        self.on_token = on_token
        self.cancel = cancel
        self.pending: StepScores | None = None
        self.scratch: torch.Tensor | None = None
        """The vocabulary-sized buffer :func:`lse_entropy` reuses at every step."""
        self.temperatures: torch.Tensor | None = None
        self._none_done: torch.Tensor | None = None
        """The all-False answer of the stopping criterion, reused while no row ends (never modified)."""
        self.step = 0
        self.start = 0.0
        self.first_token_s: float | None = None

    # a forward hook: called after a forward pass of the model (prefill and decode).
    def hook(self, module: Any, args: Any, output: Any) -> None:
        self.record(output.logits[:, -1, :])

    def record(self, logits: torch.Tensor) -> None:
        """Score one step's raw ``(batch, vocab)`` logits (any float dtype; kept until the token is chosen)."""
        import torch

        if logits.dtype != torch.float32:
            logits = logits.float()
        values, ids = top_k(logits, self.width)
        self.scratch = scratch_for(self.scratch, logits)
        lse, entropy = lse_entropy(logits, [v[0] for v in values], self.scratch)
        self.pending = StepScores(values, ids, None, None, logits, lse, entropy)

    def current_eu(self) -> torch.Tensor:
        """EU of the step being decoded, ``(batch,)`` float32 on the logits' device, from the raw logits."""
        import torch

        if self.pending is None:
            msg = "internal error: the step's EU was read before its logits were recorded"
            raise RuntimeError(msg)
        device = self.pending.logits.device if isinstance(self.pending.logits, torch.Tensor) else None  # numpy: the CPU
        return torch.tensor(self.au_eu(self.pending)[1], dtype=torch.float32, device=device)

    def au_eu(self, pending: StepScores) -> tuple[list[float], list[float]]:
        """AU and EU of each row of the step (:func:`~logtoku_guard.scoring.uncertainty.token_logtoku`), kept on ``pending``."""
        if pending.au is None or pending.eu is None:
            pending.au, pending.eu = token_logtoku([v[: self.k] for v in pending.values], self.evidence)
        return pending.au, pending.eu

    def record_temperatures(self, temperatures: torch.Tensor) -> None:
        """The ``(batch,)`` temperatures this step is sampled at (kept on each token)."""
        self.temperatures = temperatures

    # StoppingCriteria protocol: called once per step, right after the token is chosen.
    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        """Pair each row's chosen token with the step's scores; which rows are done, ``(batch,)`` bool.

        The returned tensor is read, never modified (transformers combines criteria with ``|``):
        while no row ends it is the same all-False tensor at every step.
        """
        import torch

        done = self.step_tokens(input_ids[:, -1].tolist())
        if any(done):
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
        none_done = self._none_done
        if none_done is None or none_done.shape[0] != len(done) or none_done.device != input_ids.device:
            none_done = self._none_done = torch.zeros(len(done), dtype=torch.bool, device=input_ids.device)
        return none_done

    def step_tokens(self, chosen_ids: list[int]) -> list[bool]:
        """The stopping criterion on plain ids: pair each row's chosen token with the step's scores;
        which rows are done. ``pending.logits`` may be a torch tensor or a numpy array."""
        pending = self.pending
        if pending is None:
            msg = "internal error: a decoding step finished without a recorded forward pass"
            raise RuntimeError(msg)
        self.pending = None
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.start
        values, top_ids = pending.values, pending.ids
        au, eu = self.au_eu(pending)
        # The chosen token's raw logit: among the top ids (greedy decoding, mostly), else read from the row.
        chosen_logits = [v[i.index(c)] if c in i else math.nan for c, v, i in zip(chosen_ids, values, top_ids)]
        if any(map(math.isnan, chosen_logits)):
            chosen_logits = [float(pending.logits[b, c]) for b, c in enumerate(chosen_ids)]
        lse, ent = pending.lse, pending.entropy
        temps = self.temperatures.tolist() if self.temperatures is not None else None
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
            if not all(map(math.isfinite, values[b][: self.k])):
                self._fail(b, row, NonFiniteLogitsError(len(row.tokens) + len(row.held), b, values[b][: self.k]))
                done.append(True)
                continue
            piece = row.detokenizer.step(self.tokenizer, token_id)
            token = TokenScore(
                index=len(row.tokens) + len(row.held),
                id=token_id,
                text=piece,
                top_logits=tuple(values[b][: self.k]),
                top_ids=tuple(top_ids[b][: self.k]),
                au=au[b],
                eu=eu[b],
                logprob=chosen_logits[b] - lse[b],
                entropy=ent[b],
                temperature=None if temps is None else temps[b],
                alt_logits=tuple(values[b]) if self.width > self.k else (),
                alt_ids=tuple(top_ids[b]) if self.width > self.k else (),
            )
            row.held.append(token)
            try:
                complete = row.grammar is not None and row.grammar.advance(token_id)  # True: the grammar ends the row
            except GrammarError as exc:  # this row's constraint failed: its request alone ends, with the error
                self._fail(b, row, exc)
                done.append(True)
                continue
            self._release(b, row)
            if complete and not row.done:
                self._close(b, row, "stop")
            if not row.done and row.limit is not None and len(row.tokens) + len(row.held) >= row.limit:
                self._close(b, row, "length")
            done.append(row.done)
        self.step += 1
        every = self.cancel is not None and self.cancel.is_set()
        for b, row in enumerate(self.rows):
            if not row.done and (every or (row.cancel is not None and row.cancel.is_set())):
                self._close(b, row, "cancelled")
                done[b] = True
        return done

    def _release(self, b: int, row: Row) -> None:
        """Emit held tokens that can no longer belong to a stop string; stop on a match."""
        if not row.stop and not row.model_stop:
            self._emit(b, row, len(row.held))
            return
        kept, seq, n = held_stop(row.tokens, row.held, row.stop, row.model_stop)
        if seq is not None:
            row.held = kept
            row.stop_sequence = seq
            self._close(b, row, "stop")
            return
        self._emit(b, row, n)

    def _emit(self, b: int, row: Row, n: int) -> None:
        for t in row.held[:n]:
            row.tokens.append(t)
            if self.on_token is not None:
                self.on_token(b, t)
        del row.held[:n]

    def _fail(self, b: int, row: Row, error: Exception) -> None:
        """End row ``b`` alone with ``error`` (its job's future gets it); raised when rows are not reported one by one."""
        if self.on_row_done is None:
            raise error
        row.error = error
        self._close(b, row, None)

    def _close(self, b: int, row: Row, reason: FinishReason | None) -> None:
        if row.error is None:
            self._emit(b, row, len(row.held))
        row.done = True
        row.finish_reason = reason
        if self.on_row_done is not None:
            self.on_row_done(b, row)

    def finish_row(self, b: int) -> Row:
        """Row ``b`` after generation ended (tokens still held at ``max_new_tokens`` emitted)."""
        row = self.rows[b]
        self._emit(b, row, len(row.held))
        return row


@dataclass(frozen=True)
class Scoring:
    """What the loop records of each step: top-K, evidence, the wider top logits, end-of-sequence ids."""

    k: int
    evidence: EvidenceMode
    max_logprobs: int
    eos_ids: frozenset[int]

    def recorder(
        self, tokenizer: Any, on_token: Callable[[int, TokenScore], None], on_row_done: Callable[[int, Row], None]
    ) -> StepRecorder:
        """The step recorder of a continuous batch: no rows yet (they join as admitted), no stop
        strings or cancel of its own (each row's are checked by the loop), this scoring."""
        return StepRecorder(
            k=self.k,
            evidence=self.evidence,
            tokenizer=tokenizer,
            rows=[],
            stop=(),
            eos_ids=self.eos_ids,
            on_token=on_token,
            cancel=None,
            max_logprobs=self.max_logprobs,
            on_row_done=on_row_done,
        )
