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

A chunk's cost grows with its depth (each of its tokens attends to every token before it), and a
request that arrives while a chunk runs waits for that chunk: so chunks shrink as they go deeper
(:func:`chunk_at`: ``chunk`` tokens at the start, about half as many ``DEPTH_SCALE`` tokens in,
never fewer than :data:`MIN_PREFILL_CHUNK`), which keeps each chunk's time, hence a short
request's wait, about level along the prompt. A chunk's size depends on its position alone,
never on what runs beside it, so a prompt's chunks (and every logit) are the same whatever the load.

A long prompt whose rest fits in one chunk is prefilled as a short one and joins the batch with its
first answer token. Each chunk scores the question tokens that its positions predict
(:meth:`~logtoku_guard.backends.prompt_scoring.PromptCapture.score_part`), so a prompt's
question scores and first token equal those of one whole prefill (float differences of another
matrix shape, ~1e-6, on transformers; on llama.cpp the rounding of another ubatch split, see
:data:`MIN_PREFILL_CHUNK`). ``chunk=None`` prefills every prompt whole (the old behaviour).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from logtoku_guard.backends.batching import Job, PreparedRow
from logtoku_guard.backends.hf_compat import cache_arg, returned_cache
from logtoku_guard.backends.prompt_scoring import PromptCapture
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.uncertainty import EvidenceMode
from logtoku_guard.types import TokenScore

__all__ = [
    "DEFAULT_PREFILL_CHUNK",
    "DEPTH_SCALE",
    "MIN_PREFILL_CHUNK",
    "FairShare",
    "StagedRow",
    "check_prefill_chunk",
    "chunk_at",
    "plan",
]

DEFAULT_PREFILL_CHUNK = 256
"""Prompt tokens a long prompt feeds per step by default (see ``benchmarks/bench_fairness.py`` for
the trade-off measured: smaller chunks let short requests through sooner, at a small cost to the long one)."""
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


@dataclass(eq=False)
class StagedRow:
    """A long prompt of the transformers loop being prefilled in chunks, on its own KV cache.

    ``fed``: prompt tokens in ``cache`` so far; ``scores``: its question tokens scored so far;
    ``start``: ``perf_counter()`` when it was admitted (its first-token time counts from there).
    """

    job: Job
    index: int
    prepared: PreparedRow
    start: float
    fed: int = 0
    cache: Any = None
    scores: list[TokenScore] = field(default_factory=list)
    capture: PromptCapture | None = None

    @property
    def rest(self) -> int:
        """Prompt tokens not fed yet."""
        return len(self.prepared.ids) - self.fed

    def feed(self, model: Any, n: int, k: int, evidence: EvidenceMode) -> None:
        """Run the next ``n`` prompt tokens through ``model``'s decoder (no output head but for the
        question's positions) on top of this row's cache, scoring the question tokens they predict."""
        import torch

        decoder = model.get_decoder()
        device = model.device
        ids = self.prepared.ids
        if self.capture is None and self.prepared.score_prompt and self.prepared.span is not None:
            full = torch.tensor([ids], dtype=torch.long)
            self.capture = PromptCapture(model.get_output_embeddings(), model.config, full, [self.prepared.span], k, evidence)
        a, b = self.fed, self.fed + n
        past = {cache_arg(decoder): self.cache} if self.cache is not None else {}
        out = decoder(
            input_ids=torch.tensor([ids[a:b]], dtype=torch.long, device=device),
            attention_mask=torch.ones((1, b), dtype=torch.long, device=device),
            position_ids=torch.arange(a, b, device=device)[None],
            use_cache=True,
            **past,
        )
        self.cache = returned_cache(out)
        if self.capture is not None:
            self.scores.extend(self.capture.score_part(out.last_hidden_state[0], a))
        self.fed = b
