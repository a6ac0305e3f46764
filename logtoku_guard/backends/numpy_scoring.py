"""Step scoring on numpy arrays: the llama.cpp backend's per-step maths, without torch.

The same quantities as :mod:`~logtoku_guard.backends.recorder` computes on torch tensors, for
raw float32 logits that llama.cpp hands over as memory (``(rows, vocab)`` numpy arrays):
:func:`top_k` (the same chunked search as :func:`~logtoku_guard.backends.recorder.top_k`),
:func:`lse_entropy` (log-normaliser and softmax entropy, shifted by the row maximum),
:func:`record` (a :class:`~logtoku_guard.backends.recorder.StepRecorder` step, whose AU/EU the
recorder then reads from :func:`~logtoku_guard.scoring.uncertainty.au_eu`, the library's one
implementation, as every backend does), :func:`prompt_scores` (the question's tokens scored from
the prefill's logits, as :func:`~logtoku_guard.backends.prompt_scoring.score_kept` does) and
:func:`sample` (temperature, dynamic temperature and top-p, as transformers' warpers do).

Keeping torch out of the decoding loop spares its import (about 1 s and 215 MiB of RSS) and its
OpenMP threads, which spin between operations and took the cores from llama.cpp's own threads
(32-80 instead of 109 tokens/s on 2 CPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from logtoku_guard.backends.prompt_scoring import QuestionSpan
from logtoku_guard.backends.recorder import TOP_K_CHUNK, StepRecorder, StepScores
from logtoku_guard.scoring.uncertainty import EvidenceMode, lse_entropy_of, token_logtoku
from logtoku_guard.types import DecodingOptions, TokenScore

if TYPE_CHECKING:
    import numpy as np

__all__ = ["lse_entropy", "prompt_scores", "record", "sample", "top_k"]


def top_k(logits: np.ndarray, k: int) -> tuple[list[list[float]], list[list[int]]]:
    """The ``k`` largest of each row of ``(rows, vocab)`` logits and their ids, largest first (Python lists).

    As :func:`~logtoku_guard.backends.recorder.top_k`, the vocabulary is split into groups and
    only the ``k`` groups with the largest maxima (and the vocabulary's tail) are searched: a
    group outside them has ``k`` larger maxima above its own, hence ``k`` larger values. Here a
    group is a strided set of :data:`~logtoku_guard.backends.recorder.TOP_K_CHUNK` ids
    (``g, g + n, g + 2n...``): numpy reduces along the contiguous axis several times faster.
    Equal values: the lower id first.
    """
    import numpy as np

    rows, vocab = logits.shape
    n = vocab // TOP_K_CHUNK  # groups
    if n <= k:
        order = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        return np.take_along_axis(logits, order, axis=-1).tolist(), order.tolist()
    width = n * TOP_K_CHUNK
    maxima = logits[:, :width].reshape(rows, TOP_K_CHUNK, n).max(axis=1)  # (rows, n): group g holds g + n * j
    groups = np.argpartition(maxima, n - k, axis=-1)[:, n - k :]
    ids = (groups[:, :, None] + _strides(n)).reshape(rows, -1)
    if width < vocab:
        ids = np.concatenate([ids, np.broadcast_to(np.arange(width, vocab), (rows, vocab - width))], axis=1)
    # Plain fancy indexing with a row index column (take_along_axis builds the same index, at a cost per call
    # that a one-row decoding step notices).
    at = _row_index(rows)
    cand = logits[at, ids]
    best = np.argpartition(-cand, k - 1, axis=-1)[:, :k]
    values, best_ids = cand[at, best], ids[at, best]
    order = np.lexsort((best_ids, -values), axis=-1)  # largest first; equal values: the lower id first
    return values[at, order].tolist(), best_ids[at, order].tolist()


@lru_cache(maxsize=8)
def _strides(n: int) -> np.ndarray:
    """``n * [0, 1, ... TOP_K_CHUNK - 1]``: the offsets of a strided group's ids (read-only, shared)."""
    import numpy as np

    out = n * np.arange(TOP_K_CHUNK)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=64)
def _row_index(rows: int) -> np.ndarray:
    """``[[0], [1], ... [rows - 1]]``: the row index that pairs with a ``(rows, m)`` column index (read-only, shared)."""
    import numpy as np

    out = np.arange(rows)[:, None]
    out.flags.writeable = False
    return out


LSE_BLOCK = 16
"""Rows :func:`lse_entropy` works on at once: two ``16 x 49k`` float32 buffers (6 MiB) stay in cache
between the subtraction, the ``exp`` and the two sums, instead of streaming ``rows x vocab`` temporaries."""


def lse_entropy(logits: np.ndarray, top: Sequence[float]) -> tuple[list[float], list[float]]:
    """``logsumexp`` and softmax entropy (nats) of each row of ``(rows, vocab)`` float32 logits whose maxima are ``top``.

    The vocabulary-wide sums with ``x = z - max`` and ``e = exp(x)`` (``x`` is small near the
    maximum, where ``e`` weighs, so float32 products lose little), finished by
    :func:`~logtoku_guard.scoring.uncertainty.lse_entropy_of`. NaN for a row that is not finite.

    Float32 throughout (the specification allows float32 or float64, never float16): ``e`` lies
    in ``(0, 1]`` and numpy sums a contiguous row pairwise, so a 49k-token row's sum is exact to
    about ``1e-6`` relative (its ``logsumexp`` to about ``1e-6`` absolute). The rows are done
    :data:`LSE_BLOCK` at a time into two reused buffers: no ``rows x vocab`` temporaries.
    """
    import numpy as np

    rows, vocab = logits.shape
    shifts = np.asarray(top, dtype=np.float32)
    sums = np.empty(rows, dtype=np.float32)
    dots = np.empty(rows, dtype=np.float32)
    block = min(rows, LSE_BLOCK)
    x_buf = np.empty((block, vocab), dtype=np.float32)
    e_buf = np.empty((block, vocab), dtype=np.float32)
    for lo in range(0, rows, block):
        hi = min(lo + block, rows)
        x = np.subtract(logits[lo:hi], shifts[lo:hi, None], out=x_buf[: hi - lo])
        e = np.exp(x, out=e_buf[: hi - lo])
        np.sum(e, axis=-1, out=sums[lo:hi])
        np.einsum("ij,ij->i", e, x, out=dots[lo:hi])
    return lse_entropy_of(top, sums.tolist(), dots.tolist())


def record(recorder: StepRecorder, logits: np.ndarray) -> None:
    """Score one step's raw ``(rows, vocab)`` float32 logits into ``recorder`` (kept until its tokens are chosen)."""
    values, ids = top_k(logits, recorder.width)
    lse, entropy = lse_entropy(logits, [v[0] for v in values])
    recorder.pending = StepScores(values, ids, None, None, logits, lse, entropy)


def prompt_scores(
    logits: np.ndarray, ids: Sequence[int], span: QuestionSpan, k: int, evidence: EvidenceMode
) -> tuple[TokenScore, ...]:
    """The question's tokens scored teacher-forced: ``logits`` ``(n, vocab)`` are those of the positions
    ``first - 1 ... span.end - 2`` (``first = max(span.start, 1)``), each scoring the next token of ``ids``."""
    first = max(span.start, 1)
    if span.end <= first:
        return ()
    values, top_ids = top_k(logits, k)
    au, eu = token_logtoku(values, evidence)
    lse, entropy = lse_entropy(logits, [v[0] for v in values])
    out = []
    for j in range(span.end - first):
        target = int(ids[first + j])
        out.append(
            TokenScore(
                index=span.first_index + first + j - span.start,
                id=target,
                text=span.texts[first + j - span.start],
                top_logits=tuple(values[j]),
                top_ids=tuple(top_ids[j]),
                au=au[j],
                eu=eu[j],
                logprob=float(logits[j, target]) - lse[j],
                entropy=entropy[j],
            )
        )
    return tuple(out)


def sample(recorder: StepRecorder, logits: np.ndarray, options: DecodingOptions, rng: np.random.Generator) -> list[int]:
    """One token per row: temperature (or the dynamic temperature of each row's EU), then top-p.

    As transformers' ``TemperatureLogitsWarper`` and ``TopPLogitsWarper``: top-p keeps the
    smallest set of likeliest tokens whose probability reaches ``top_p`` (at least one). Rows
    whose logits are not finite get the arg-max (the recorder ends them with the error).
    """
    import numpy as np

    pending = recorder.pending
    if pending is None:
        msg = "internal error: sampling before the step's logits were recorded"
        raise RuntimeError(msg)
    if options.dynamic is not None:
        eus = recorder.au_eu(pending)[1]  # EU is clamped in both evidence modes
        temperatures = np.asarray([options.dynamic.temperature(e) for e in eus], dtype=np.float64)
        recorder.record_temperatures(temperatures)  # type: ignore[arg-type]
    else:
        temperatures = np.full(logits.shape[0], float(options.temperature))
    chosen: list[int] = []
    for b, row in enumerate(logits):
        z = row.astype(np.float64) / temperatures[b]
        if not np.isfinite(z).all():
            chosen.append(int(np.argmax(row)))
            continue
        p = np.exp(z - z.max())
        p /= p.sum()
        if options.top_p < 1.0:
            order = np.argsort(p, kind="stable")  # ascending
            cumulative = np.cumsum(p[order])
            remove = cumulative <= 1.0 - options.top_p
            remove[-1] = False
            p[order[remove]] = 0.0
            p /= p.sum()
        cdf = np.cumsum(p)
        chosen.append(int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(p) - 1)))
    return chosen
