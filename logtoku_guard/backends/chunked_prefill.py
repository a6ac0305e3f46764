"""Chunked prefill: a long prompt enters the KV cache a chunk at a time, so it cannot stall the rows beside it.

Without it, a prompt that joins a running batch is prefilled whole between two decoding steps:
one 7.5k-token prompt held every short request beside it for its whole prefill (127 s on
transformers, 194 s on llama.cpp, embedded model, 2 busy vCPUs; ``benchmarks/bench_fairness.py``
and benchmarks/README.md, "Fairness", for the figures with chunking). Both decode loops
(:mod:`~logtoku_guard.backends.decode_loop`, :mod:`~logtoku_guard.backends.llamacpp_loop`) now
follow one schedule, vLLM's chunked prefill with short prompts first (its
``max_long_partial_prefills=1``). Each step:

1. decodes one token of every live row;
2. prefills whole every newly admitted prompt that has at most ``chunk`` tokens left;
3. feeds the next chunk of the oldest longer prompt (:func:`plan`), when its turn has
   come (:class:`FairShare`): while rows are decoding, a chunk runs only once they have had as
   much time since the last chunk as that chunk took. On a CPU a chunk deep in a long prompt takes
   seconds (256 tokens at position 7k: ~4 s on the embedded model), so one chunk per decoding
   step would still hold a short answer for seconds per token; sharing time evenly bounds its
   wait by one chunk, and slows the long prompt at most 2x, only while others decode.

By default both loops feed those chunks by a thread of their own instead (:class:`Beside`,
``concurrent_prefill``): the decoding rows then keep a core while the long prompt is fed, where
taking turns made a short request wait for the chunk in progress and share the time with it (beside a
7.3k-token prompt, the short requests' p99 went from 9.2x of alone to 2.8x on llama.cpp, and from
6.5x to 1.8-2.4x on transformers; ``benchmarks/README.md``). The chunks and their logits are the same
either way.

A chunk's cost grows with its depth (each of its tokens attends to every token before it), and a
request that arrives while a chunk runs waits for that chunk: so chunks shrink as they go deeper
(:func:`chunk_at`: ``chunk`` tokens at the start, about half as many ``DEPTH_SCALE`` tokens in,
never fewer than :data:`MIN_PREFILL_CHUNK`), which keeps each chunk's time, hence a short
request's wait, about level along the prompt. A chunk's size depends on its position alone,
never on what runs beside it, so a prompt's chunks (and every logit) are the same whatever the load.

On llama.cpp a fixed chunk is still too coarse: with the embedded Q4_1 weights a prompt token
costs ~11 ms at the start and ~45 ms 7k tokens deep (CPU, 1 thread; prefill batches barely better
than decoding there, ggml has no matrix-matrix kernel for Q4_1 on x86), so a 128-token chunk deep in
a long prompt took 6 s of CPU, 10-15 s on 2 busy vCPUs, and short requests waited that long per
chunk. There a step's share of a long prompt can be sized by time (:class:`BudgetedPrefill`, the
backend's ``prefill_budget_s``; off by default, :data:`DEFAULT_PREFILL_BUDGET_S` says why): the prompt is fed in small
pieces (:func:`piece_at`: 32 tokens at the start, fewer deeper, at least :data:`MIN_PIECE`), each its
own ``llama_decode``, and a step takes pieces while the cost measured so far (:class:`PrefillCost`:
seconds per token at a depth, following the load) says they fit the budget, at least one. The
pieces' boundaries are the position's alone, so the prompt's logits do not depend on the budget, the
clock or the load; ggml rounds such short ubatches as it rounds decoding steps, up to 0.5 in a
prompt token's log p from one whole prefill. The decoding rows still take their turn between steps
(:class:`FairShare`).

A long prompt whose rest fits in one chunk is prefilled as a short one and joins the batch with its
first answer token. Each chunk scores the question tokens that its positions predict
(:meth:`~logtoku_guard.backends.prompt_scoring.PromptCapture.score_part`), so a prompt's
question scores and first token equal those of one whole prefill (float differences of another
matrix shape, ~1e-6, on transformers; on llama.cpp the rounding of another ubatch split, see
:data:`MIN_PREFILL_CHUNK`). ``chunk=None`` prefills every prompt whole (the old behaviour).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from logtoku_guard.errors import ConfigurationError

__all__ = [
    "DEFAULT_PREFILL_BUDGET_S",
    "DEFAULT_PREFILL_CHUNK",
    "DEPTH_SCALE",
    "IDLE_POLL_S",
    "MIN_PIECE",
    "MIN_PREFILL_CHUNK",
    "PIECE_TOKENS",
    "Beside",
    "BudgetedPrefill",
    "FairShare",
    "PrefillCost",
    "check_prefill_budget",
    "check_prefill_chunk",
    "chunk_at",
    "next_piece",
    "piece_at",
    "plan",
]

DEFAULT_PREFILL_CHUNK = 256
"""Prompt tokens a long prompt is fed at a time by default, fewer deeper (:func:`chunk_at`; see
``benchmarks/bench_fairness.py`` for the trade-off measured in the loop: smaller chunks let short
requests through sooner, at a small cost to the long one)."""
MIN_PREFILL_CHUNK = 128
"""The smallest chunk accepted. On llama.cpp a chunk boundary is a ubatch boundary: chunks of 32
or 64 tokens moved a long prompt's log p by up to 0.5 from one whole prefill (ggml computes short
ubatches another way), chunks of 128 to 512 by 0.17 at most (0.0 on 635- and 1115-token prompts,
0.03 and 0.17 on 815-token ones: the rounding any change of ``n_ubatch`` gives). Below 128, a step's fixed
cost also dominates. A prompt of at most one chunk is prefilled exactly as before."""

DEPTH_SCALE = 2048
"""Prompt depth (tokens already in the cache) at which a chunk is cut to half of ``chunk``
(:func:`chunk_at`): about where a token's attention over the tokens before it costs as much as the
rest of its forward pass on the embedded model (30 layers of 576-wide attention against ~0.2 GFLOP
of weights per token)."""


T = TypeVar("T")


def check_prefill_chunk(value: object) -> int | None:
    """``value`` as a chunk size: a whole number of tokens >= :data:`MIN_PREFILL_CHUNK`, or
    ``None``/``0`` to prefill every prompt whole."""
    if value is None or (type(value) is int and value == 0):
        return None
    if type(value) is not int or value < MIN_PREFILL_CHUNK:
        msg = (
            f"prefill_chunk must be a whole number of tokens >= {MIN_PREFILL_CHUNK} "
            f"(or 0 to prefill every prompt whole), got {value!r}"
        )
        raise ConfigurationError(msg)
    return value


def chunk_at(fed: int, chunk: int | None) -> int | None:
    """Prompt tokens the next chunk feeds when ``fed`` tokens are in the cache already: ``chunk`` at
    the start of the prompt, ``chunk * DEPTH_SCALE / (DEPTH_SCALE + fed)`` deeper (a multiple of 16),
    never fewer than :data:`MIN_PREFILL_CHUNK` (nor than ``chunk``, if smaller). None: chunking is off."""
    if chunk is None:
        return None
    scaled = chunk * DEPTH_SCALE // (DEPTH_SCALE + max(fed, 0)) // 16 * 16
    return max(scaled, min(chunk, MIN_PREFILL_CHUNK))


def plan(rest: Sequence[tuple[T, int, int]], chunk: int | None) -> tuple[list[T], list[T]]:
    """Split waiting rows into those to prefill whole this step (a new prompt whose tokens fit in one
    chunk, or every prompt when chunking is off) and the longer ones, which feed one chunk a step
    (:func:`chunk_at`), oldest first, taking turns with the decoding rows (a prompt partly fed
    already stays with them to its end).

    ``rest`` lists each waiting row with its prompt tokens not yet fed and those fed, oldest first.
    """
    whole = [row for row, n, fed in rest if chunk is None or (fed == 0 and n <= chunk)]
    longer = [row for row, n, fed in rest if chunk is not None and (fed > 0 or n > chunk)]
    return whole, longer


DEFAULT_PREFILL_BUDGET_S = 0.0
"""Seconds of a long prompt's prefill one scheduler step may take on llama.cpp by default: 0, off
(fixed chunks, :func:`chunk_at`). A budget (``prefill_budget_s=0.2``, :class:`BudgetedPrefill`) makes
a short request arriving meanwhile wait about that long (or one :func:`piece_at` piece, when a
single piece takes longer), but measured beside a 7.3k-token prompt it cut the short requests' p99
only from 32.8x to 14.3x of alone, made the long prompt 4.4x slower and moved its prompt tokens' log p
by up to 0.5 from one whole prefill (0.17 with 128-token chunks): ``benchmarks/README.md``, fairness."""
PIECE_TOKENS = 32
"""Tokens of a budgeted prefill's piece at the start of a prompt (:func:`piece_at`)."""
MIN_PIECE = 8
"""The smallest piece of a budgeted prefill, however deep (:func:`piece_at`)."""


def check_prefill_budget(value: object) -> float | None:
    """``value`` as a prefill step budget in seconds: a finite number > 0 and at most 60, or
    ``None``/``0`` for fixed chunks (:func:`chunk_at`, one ``llama_decode`` each)."""
    if value is None or (type(value) in (int, float) and value == 0):
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not 0 < value <= 60:
        msg = (
            "prefill_budget_s must be a number of seconds > 0 and <= 60 (or 0 for fixed chunks of "
            f"prefill_chunk tokens), got {value!r}"
        )
        raise ConfigurationError(msg)
    return float(value)


def piece_at(fed: int, piece: int = PIECE_TOKENS) -> int:
    """Tokens of the piece that starts ``fed`` tokens into a prompt: ``piece`` at the start,
    ``piece * DEPTH_SCALE / (DEPTH_SCALE + fed)`` deeper, never fewer than :data:`MIN_PIECE`.

    A budgeted prefill feeds a long prompt in these pieces, each its own ``llama_decode``. Their
    boundaries depend on the position alone, never on time or load: a step takes as many pieces
    as its budget allows (:class:`BudgetedPrefill`), so the prompt's logits are the same whatever
    runs beside it. Each piece costs about the same: a token's cost grows with its depth.
    """
    return max(piece * DEPTH_SCALE // (DEPTH_SCALE + max(fed, 0)), MIN_PIECE)


class PrefillCost:
    """What a prompt token costs at a depth, learnt from the pieces timed so far (one per backend).

    The model: a token ``d`` tokens deep costs ``per_token * (1 + d / DEPTH_SCALE)`` seconds (its
    attention over the tokens before it grows with ``d``), and ``per_token`` follows the latest
    pieces (an exponential average of weight ``weight``), so it tracks the machine's load.
    """

    def __init__(self, weight: float = 0.5, scale: int = DEPTH_SCALE) -> None:
        self.weight = weight
        self.scale = scale
        self.per_token: float | None = None  # seconds per token at depth 0 (None: nothing timed yet)

    def _units(self, fed: int, n: int) -> float:
        return n * (1.0 + (fed + n / 2) / self.scale)

    def estimate(self, fed: int, n: int) -> float:
        """Seconds the ``n`` tokens after the first ``fed`` are expected to take (0.0 before any was timed)."""
        return 0.0 if self.per_token is None else self.per_token * self._units(fed, n)

    def observe(self, fed: int, n: int, seconds: float) -> None:
        """The ``n`` tokens after the first ``fed`` took ``seconds``."""
        if n <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        sample = seconds / self._units(fed, n)
        self.per_token = sample if self.per_token is None else (1 - self.weight) * self.per_token + self.weight * sample


def next_piece(fed: int, total: int, spent: float, budget_s: float, cost: PrefillCost, first: bool) -> int:
    """Tokens of this step's next piece of a ``total``-token prompt with ``fed`` in, or 0 when the
    step's prefill ends: the prompt is in, or the piece would take the step past ``budget_s``
    (``spent`` seconds already; the step's first piece always runs, so the prompt always advances)."""
    if fed >= total:
        return 0
    n = min(piece_at(fed), total - fed)
    if not first and spent + cost.estimate(fed, n) > budget_s:
        return 0
    return n


class BudgetedPrefill:
    """One step's share of a long prompt's prefill, sized by time: pieces (:func:`piece_at`) run
    while the step stays within ``budget_s`` seconds by the measured cost (:class:`PrefillCost`).

    Fixed chunks of tokens (:func:`chunk_at`) cannot keep a step short on a CPU where a chunk's
    cost grows several-fold with its depth and with the load (256 tokens 7k deep: 10 s on
    llama.cpp with the embedded Q4_1 weights on 2 busy vCPUs); a short request's decoding steps
    waited behind each one.
    """

    def __init__(self, budget_s: float, cost: PrefillCost | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.budget_s = budget_s
        self.cost = cost if cost is not None else PrefillCost()
        self.clock = clock

    def turn(self, fed: int, total: int, feed: Callable[[int], bool]) -> float:
        """Feed pieces of a ``total``-token prompt from ``fed`` on, while the budget allows.

        ``feed(n)`` runs the next ``n`` tokens and returns whether the prompt still takes pieces
        (False: it is in, or it failed). Returns the seconds spent.
        """
        start = self.clock()
        first = True
        while n := next_piece(fed, total, self.clock() - start, self.budget_s, self.cost, first):
            t = self.clock()
            going = feed(n)
            self.cost.observe(fed, n, self.clock() - t)
            fed += n
            first = False
            if not going:
                break
        return self.clock() - start

    def pieces(self, fed: int, total: int) -> int:
        """Pieces that feed the rest of the prompt (the most steps its prefill takes: one piece each at least)."""
        count = 0
        while fed < total:
            fed += piece_at(fed)
            count += 1
        return count


IDLE_POLL_S = 0.02
"""While only a long prompt's concurrent prefill runs, how often a loop looks for new requests (seconds)."""


class Beside(Generic[T]):
    """A long prompt's chunks fed by a thread of its own while the decoding loop goes on (a
    concurrent prefill: :class:`~logtoku_guard.backends.llamacpp_loop.LlamaDecodeLoop` on a second
    llama.cpp context, :class:`~logtoku_guard.backends.decode_loop.DecodeLoop` on the row's own KV cache).

    ``chunk()`` feeds the row's next chunk (:func:`chunk_at`, so its boundaries are those the loop
    itself would feed) and returns whether the thread has more to feed; the thread stops there, when
    :meth:`finish` asks it to (at the end of the chunk in progress), or once ``abandoned()``. Until
    :attr:`done` is set only the thread touches the row; an exception it raised is kept in
    :attr:`error` for the loop to hand to that request.

    On a CPU of two cores or more the decoding rows then keep a core while the prompt is fed, where
    taking turns in one loop (:class:`FairShare`) made a short request wait for a chunk in progress
    and share the time with the rest (``benchmarks/bench_fairness.py``).
    """

    def __init__(self, row: T, chunk: Callable[[], bool], abandoned: Callable[[], bool], name: str) -> None:
        self.row = row
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._chunk = chunk
        self._abandoned = abandoned
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and not self._abandoned() and self._chunk():
                pass
        except BaseException as exc:  # handed to the loop, which fails this request with it
            self.error = exc
        finally:
            self.done.set()

    def finish(self) -> None:
        """Stop at the end of the chunk in progress and wait for the thread."""
        self._stop.set()
        self._thread.join()


class FairShare:
    """Whose turn it is: the decoding rows' or the oldest long prompt's next chunk.

    Time, not tokens, is shared, and only *when* a chunk runs depends on it: the chunks themselves
    (their boundaries, hence every logit) are the same whatever runs beside them.
    """

    def __init__(self) -> None:
        self.owed = 0.0  # seconds of decoding the live rows are owed before the next chunk

    def chunk_may_run(self, decoding: bool) -> bool:
        """Whether a chunk may run now (always when no row is decoding: nobody waits for it)."""
        return not decoding or self.owed <= 0.0

    def chunk_ran(self, seconds: float) -> None:
        self.owed = seconds

    def decoded(self, seconds: float) -> None:
        self.owed -= seconds
