"""The step recorder: raw top-K capture, token scoring and stop strings, one step at a time.

:class:`StepRecorder` is driven by the backend's decode loop
(:mod:`logtoku_guard.backends.decode_loop`), with the interface of a forward hook and a
stopping criterion of transformers' ``generate``. :meth:`StepRecorder.record` (the hook reads
``outputs.logits[:, -1]``) takes each step's raw logits, *before* any logits processor
(repetition penalty, temperature, top-k/p...) touches them, and keeps only what LogTokU
needs (:class:`StepScores`): the top-K values and ids (:func:`top_k`), AU, EU, the
full-softmax entropy and its log-normaliser (:func:`lse_entropy`, from the top-K's maximum)
and, for one step only, the raw row from which the chosen token's log-probability is read
(its logit minus the normaliser). The stopping criterion (called once per step, right after
the token is chosen) pairs the chosen token with that step's scores, detokenizes it
(:mod:`logtoku_guard.backends.detokenizer`), handles stop strings and streams the token
out. Memory grows with steps x K, never with steps x vocabulary.

Stop strings (:func:`truncate_at_stop`, :func:`releasable`) are plain functions on
:class:`~logtoku_guard.types.TokenScore` lists, shared with the scripted backend so both cut
an answer the same way. No torch import at module level.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.detokenizer import IncrementalDetokenizer
from logtoku_guard.errors import NonFiniteLogitsError
from logtoku_guard.types import FinishReason, TokenScore
from logtoku_guard.uncertainty import EvidenceMode, logsumexp_entropy, logtoku

if TYPE_CHECKING:
    import torch


# -- stop strings --------------------------------------------------------------------------------
def find_stop(text: str, stop: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` as ``(character offset, stop string)``, or None.

    Two stop strings starting at the same offset: the one that sorts first wins.
    """
    return min(((text.find(s), s) for s in stop if s in text), default=None)


def cut_tokens(tokens: Sequence[TokenScore], cut: int) -> list[TokenScore]:
    """The tokens whose text starts before character ``cut``; the one across it is truncated.

    A truncated token keeps its scores (its ``text`` only is shortened).
    """
    kept: list[TokenScore] = []
    offset = 0
    for t in tokens:
        if offset >= cut:
            break
        end = offset + len(t.text)
        kept.append(t if end <= cut else dataclasses.replace(t, text=t.text[: cut - offset]))
        offset = end
    return kept


def truncate_at_stop(tokens: Sequence[TokenScore], stop: Sequence[str]) -> tuple[list[TokenScore], str | None]:
    """``tokens`` cut before the earliest stop string, and that stop string (None: none found)."""
    match = find_stop("".join(t.text for t in tokens), stop)
    if match is None:
        return list(tokens), None
    cut, seq = match
    return cut_tokens(tokens, cut), seq


def releasable(tokens: Sequence[TokenScore], stop: Sequence[str]) -> int:
    """How many leading ``tokens`` can no longer be part of a stop string (with no match in them).

    The text that ends the tokens and begins some stop string is held back: a later token may
    complete the stop string.
    """
    text = "".join(t.text for t in tokens)
    safe = len(text) - max((_overlap(text, s) for s in stop), default=0)
    n, offset = 0, 0
    for t in tokens:
        offset += len(t.text)
        if offset > safe:
            break
        n += 1
    return n


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


# -- per-step recording ----------------------------------------------------------------------------
def digamma(x: float) -> float:
    """The digamma function for ``x > 0`` (recurrence up to 6, then the asymptotic series; ~1e-13)."""
    shift = 0.0
    while x < 6.0:
        shift -= 1.0 / x
        x += 1.0
    f = 1.0 / (x * x)
    series = f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f * (1 / 240 - f / 132))))
    return shift + math.log(x) - 0.5 / x - series


def clamped_logtoku(values: Sequence[float]) -> tuple[float, float]:
    """AU and EU of one token's top-K logits, clamped evidence, in float64 Python.

    The same maths as :func:`~logtoku_guard.uncertainty.logtoku` (``"clamped"``) without a
    dozen tiny tensor operations per step: for the K values of a token (K is small) plain
    floats are several times cheaper. Non-finite values give NaN (the caller raises).
    """
    if not all(map(math.isfinite, values)):
        return math.nan, math.nan
    alpha = [v if v > 0.0 else 0.0 for v in values]
    alpha0 = sum(alpha)
    eu = len(values) / (alpha0 + len(values))
    if alpha0 <= 0.0:
        return 0.0, eu
    psi0 = digamma(alpha0 + 1.0)
    au = -sum((a / alpha0) * (digamma(a + 1.0) - psi0) for a in alpha if a > 0.0)
    return max(au, 0.0), eu


TOP_K_CHUNK = 64


LOG2E = 1.0 / math.log(2.0)
"""``log2 e``: ``exp(x) = exp2(x * LOG2E)``."""


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits.topk(k, dim=-1)`` of ``(batch, vocab)`` logits, in about one vectorised pass.

    ``torch.topk`` over a whole vocabulary costs several times a plain reduction on CPU. The
    vocabulary is cut into chunks of :data:`TOP_K_CHUNK`; the top ``k`` values lie in the
    ``k`` chunks with the largest maxima (a chunk outside them has ``k`` larger chunk maxima
    above its own, hence ``k`` larger values), so one ``amax`` per chunk, a top-K over the
    chunk maxima and one over ``k`` chunks (plus the vocabulary's tail) give the same values
    and ids (ids of exactly equal values may be another of the equal ones).
    """
    import torch

    rows, vocab = logits.shape
    n = vocab // TOP_K_CHUNK
    if n <= k:
        return logits.topk(k, dim=-1)
    head = logits[:, : n * TOP_K_CHUNK].reshape(rows, n, TOP_K_CHUNK)
    _, chunks = head.amax(dim=-1).topk(k, dim=-1)  # (rows, k)
    cand = head.gather(1, chunks.unsqueeze(-1).expand(rows, k, TOP_K_CHUNK)).reshape(rows, k * TOP_K_CHUNK)
    offsets = torch.arange(TOP_K_CHUNK, device=logits.device)
    cand_ids = (chunks.unsqueeze(-1) * TOP_K_CHUNK + offsets).reshape(rows, k * TOP_K_CHUNK)
    if n * TOP_K_CHUNK < vocab:
        cand = torch.cat([cand, logits[:, n * TOP_K_CHUNK :]], dim=1)
        tail = torch.arange(n * TOP_K_CHUNK, vocab, device=logits.device).expand(rows, -1)
        cand_ids = torch.cat([cand_ids, tail], dim=1)
    values, pos = cand.topk(k, dim=-1)
    return values, cand_ids.gather(1, pos)


def lse_entropy(
    logits: torch.Tensor, top: torch.Tensor, scratch: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logsumexp`` and softmax entropy of ``(batch, vocab)`` float32 logits whose row maxima are ``top``.

    The scoring cost of a step beyond its one top-K: the maximum comes free with the top-K,
    then one ``exp(z - max)`` written in place, its sum ``s`` and its dot product with the
    logits ``d``: ``logsumexp = max + log s`` and ``entropy = logsumexp - d / s`` (three passes
    over the vocabulary instead of the seven of a separate logsumexp and ``p * z``). The
    exponential is taken as ``exp2((z - max) * log2 e)``: torch's CPU ``exp2`` kernel is about
    3x faster than its ``exp`` (float32 error ~1e-6, as before). ``scratch``, a float32 tensor
    of the logits' shape, receives the exponentials: a decoding loop passes the same one at
    every step (:func:`scratch_for`), which spares a fresh vocabulary-sized allocation (and
    its page faults, the larger cost at batch 8 on CPU) per step. Rows with masked (-inf) or
    non-finite logits fall back to :func:`~logtoku_guard.uncertainty.logsumexp_entropy`.
    """
    import torch

    e = torch.mul(logits, LOG2E, out=scratch) if scratch is not None else logits * LOG2E
    e.sub_((top * LOG2E).unsqueeze(-1)).exp2_()
    s = e.sum(dim=-1)
    d = torch.linalg.vecdot(e, logits)
    lse = top + s.log()
    entropy = (lse - d / s).clamp_min(0.0)
    if not bool(torch.isfinite(entropy).all()):
        lse, entropy = logsumexp_entropy(logits)
    return lse, entropy


def scratch_for(scratch: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
    """``scratch`` when it fits ``logits`` (shape, dtype, device), else a new buffer that does."""
    import torch

    if scratch is None or scratch.shape != logits.shape or scratch.dtype != logits.dtype or scratch.device != logits.device:
        return torch.empty_like(logits)
    return scratch


@dataclass
class StepScores:
    """One decoding step's scores, waiting for the chosen token (all ``(batch, ...)`` float32).

    ``values``/``ids``: ``(batch, max(K, max_logprobs))`` raw top logits (largest first) and their
    token ids (AU/EU read the first K); ``au``/``eu``/``lse``/``entropy``: ``(batch,)`` (``au``/``eu``
    None until asked for: the criterion scores clamped evidence in Python, :func:`clamped_logtoku`);
    ``logits``: ``(batch, vocab)``, this
    step's raw row, kept only until the token is chosen.
    """

    values: torch.Tensor
    ids: torch.Tensor
    au: torch.Tensor | None
    eu: torch.Tensor | None
    logits: torch.Tensor
    lse: torch.Tensor
    entropy: torch.Tensor


@dataclass
class Row:
    """Decoding state of one batch row: emitted tokens and those held back for stop strings.

    A row may carry its own settings (a batch of independent requests): ``stop`` strings,
    ``limit`` (its ``max_new_tokens``; None: the batch's) and ``cancel`` (ends this row only).
    ``error`` is set, and the row closed, when its logits are not finite and the recorder
    isolates rows (``on_row_done`` given): the other rows go on.
    """

    detokenizer: IncrementalDetokenizer = field(default_factory=IncrementalDetokenizer)
    held: list[TokenScore] = field(default_factory=list)
    tokens: list[TokenScore] = field(default_factory=list)
    done: bool = False
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None
    stop: tuple[str, ...] = ()
    limit: int | None = None
    cancel: threading.Event | None = None
    error: BaseException | None = None


class StepRecorder:
    """Forward hook + stopping criterion: one record per row per step, no vocab-sized history.

    Row ``b`` of each step's logits and chosen tokens is ``rows[b]``. The decode loop of a
    continuous batch edits ``rows`` between steps (rows appended as requests join, removed
    as they leave) so that it always lists the live rows in batch order.

    Args:
        k: top-K logits kept per token.
        evidence: ``"clamped"`` or ``"raw"`` (see :func:`~logtoku_guard.uncertainty.logtoku`).
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
        self.step = 0
        self.start = 0.0
        self.first_token_s: float | None = None

    # a forward hook: called after a forward pass of the model (prefill and decode).
    def hook(self, module: Any, args: Any, output: Any) -> None:
        self.record(output.logits[:, -1, :])

    def record(self, logits: torch.Tensor) -> None:
        """Score one step's raw ``(batch, vocab)`` logits (any float dtype; kept until the token is chosen)."""
        logits = logits.float()
        values, ids = top_k(logits, self.width)
        au = eu = None
        if self.evidence != "clamped":
            au, eu = logtoku(values[:, : self.k], self.evidence)
        self.scratch = scratch_for(self.scratch, logits)
        lse, entropy = lse_entropy(logits, values[:, 0], self.scratch)
        self.pending = StepScores(values, ids, au, eu, logits, lse, entropy)

    def current_eu(self) -> torch.Tensor:
        """EU of the step being decoded, ``(batch,)`` float32, from the raw logits."""
        if self.pending is None:
            msg = "internal error: the step's EU was read before its logits were recorded"
            raise RuntimeError(msg)
        if self.pending.eu is None:
            self.pending.au, self.pending.eu = logtoku(self.pending.values[:, : self.k], self.evidence)
        return self.pending.eu

    def record_temperatures(self, temperatures: torch.Tensor) -> None:
        """The ``(batch,)`` temperatures this step is sampled at (kept on each token)."""
        self.temperatures = temperatures

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
        if pending.au is None or pending.eu is None:
            au, eu = map(list, zip(*(clamped_logtoku(v[: self.k]) for v in values)))
        else:
            au, eu = pending.au.tolist(), pending.eu.tolist()
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
            if not all(map(math.isfinite, values[b][: self.k])):
                error = NonFiniteLogitsError(len(row.tokens) + len(row.held), b, values[b][: self.k])
                if self.on_row_done is None:
                    raise error
                row.error = error
                self._close(b, row, None)
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
                logprob=lp[b],
                entropy=ent[b],
                temperature=None if temps is None else temps[b],
                alt_logits=tuple(values[b]) if self.width > self.k else (),
                alt_ids=tuple(top_ids[b]) if self.width > self.k else (),
            )
            row.held.append(token)
            self._release(b, row)
            if not row.done and row.limit is not None and len(row.tokens) + len(row.held) >= row.limit:
                self._close(b, row, "length")
            done.append(row.done)
        self.step += 1
        every = self.cancel is not None and self.cancel.is_set()
        for b, row in enumerate(self.rows):
            if not row.done and (every or (row.cancel is not None and row.cancel.is_set())):
                self._close(b, row, "cancelled")
                done[b] = True
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def _release(self, b: int, row: Row) -> None:
        """Emit held tokens that can no longer belong to a stop string; stop on a match."""
        if not row.stop:
            self._emit(b, row, len(row.held))
            return
        kept, seq = truncate_at_stop(row.held, row.stop)
        if seq is not None:
            row.held = kept
            row.stop_sequence = seq
            self._close(b, row, "stop")
            return
        self._emit(b, row, releasable(row.held, row.stop))

    def _emit(self, b: int, row: Row, n: int) -> None:
        for t in row.held[:n]:
            row.tokens.append(t)
            if self.on_token is not None:
                self.on_token(b, t)
        del row.held[:n]

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
