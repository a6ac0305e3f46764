"""The transformers loop's long prompts, fed a chunk at a time on their own KV caches (:class:`StagedPrompts`).

A prompt longer than ``prefill_chunk`` is staged (:class:`StagedRow`): its chunks but the last
(:func:`~logtoku_guard.backends.chunked_prefill.chunk_at`) run through the decoder alone on the
row's own cache, scoring the question tokens each predicts; its last chunk runs through the whole
model (its first token's logits) and the row joins the running batch
(:meth:`~logtoku_guard.backends.decode_loop.DecodeLoop._join_group`). Who runs them: by default a
thread of their own while the loop decodes (``concurrent``,
:class:`~logtoku_guard.backends.chunked_prefill.Beside`). There a one-row request is answered whole,
prefill and decoding, by a decode loop of its own (``apart``): joined, a 7k-token row would pad every
row of the left-padded batch to its length, and each decoding step of the short rows beside it would
attend over all of it until it ended (their slowest requests took 3-5 s against 0.6 s alone:
``benchmarks/README.md``). The rows of a request of several are fed there, their last chunk too, and
join the batch. Without ``concurrent`` the loop feeds one chunk when its turn comes
(:class:`~logtoku_guard.backends.chunked_prefill.FairShare`) and the last as the row joins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.batching import Job, PreparedRow
from logtoku_guard.backends.chunked_prefill import IDLE_POLL_S, Beside, FairShare, chunk_at
from logtoku_guard.backends.hf_compat import cache_arg, returned_cache
from logtoku_guard.backends.prompt_scoring import PromptCapture
from logtoku_guard.scoring.uncertainty import EvidenceMode
from logtoku_guard.types import TokenScore

if TYPE_CHECKING:
    import torch

__all__ = ["Prefilled", "StagedPrompts", "StagedRow"]

SIDE_THREAD = "logtoku-transformers-prefill"
"""The name of the thread that feeds a staged prompt's chunks beside the loop."""


@dataclass(eq=False)
class Prefilled:
    """A group's prefill forward, its rows not in the batch yet
    (:meth:`~logtoku_guard.backends.decode_loop.DecodeLoop._join_group` joins them)."""

    mask: torch.Tensor  # the rows' attention mask over the prompt
    cache: Any  # their KV cache
    logits: torch.Tensor  # (rows, vocab) first-token logits
    last: torch.Tensor  # (rows,) last prompt tokens
    prompt_scores: list[tuple[TokenScore, ...]]  # each row's question tokens scored by this forward


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
    prefilled: Prefilled | None = None  # the last chunk's forward, when its thread ran it

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


class StagedPrompts:
    """The loop's staged (long) prompts, oldest first, and whoever feeds the oldest one's chunks.

    Args:
        model: the causal LM (its decoder runs the chunks).
        k, evidence: how the question's tokens are scored.
        chunk: ``prefill_chunk`` (a prompt longer than this was staged).
        concurrent: a thread of its own feeds the chunks (:class:`~logtoku_guard.backends.chunked_prefill.Beside`);
            False: :meth:`advance` feeds one when the decoding rows have had their turn.
        last: runs a row's last chunk (the loop's forward, scored, not joined), in the thread when ``concurrent``.
        apart: answers a one-row request whole in a loop of its own (``concurrent``): its thread prefills
            and decodes it alone, so the long row never joins (and widens) the running batch.
    """

    def __init__(
        self,
        model: Any,
        k: int,
        evidence: EvidenceMode,
        chunk: int | None,
        concurrent: bool,
        last: Callable[[StagedRow], Prefilled],
        apart: Callable[[StagedRow], None] | None = None,
    ) -> None:
        self.model = model
        self.k = k
        self.evidence = evidence
        self.chunk = chunk
        self.concurrent = concurrent and chunk is not None
        self.last = last
        self.apart = apart
        self.rows: list[StagedRow] = []
        self.side: Beside[StagedRow] | None = None
        self.share = FairShare()

    def __len__(self) -> int:
        return len(self.rows)

    def _last(self, row: StagedRow) -> int:
        """Tokens of ``row``'s next chunk (the loop prefills the rest into the batch once it fits in one)."""
        return chunk_at(row.fed, self.chunk) or 0

    def turn(self, decoding: bool) -> bool:
        """Whether :meth:`advance` has anything to do now (a staged prompt, and in the loop its turn)."""
        return bool(self.rows) and (self.concurrent or self.share.chunk_may_run(decoding))

    def advance(self, mergeable: bool, drop: Callable[[StagedRow], None]) -> StagedRow | None:
        """Feed the oldest staged prompt (start its thread, or run one chunk here); return it, taken off
        the list, once the batch can take it (``mergeable``) and its thread ran every chunk (its
        ``prefilled`` set: the loop joins it), or, fed here, only its last chunk is left (the loop
        prefills it into the batch). Abandoned prompts go to ``drop``; a prompt whose chunk failed
        gets the error (the running rows go on)."""
        side = self.side
        if side is not None:
            if not side.done.is_set():
                return None
            self.side = None
            if side.error is not None:
                self._fail(side.row, side.error)
                return None
            if side.row.job.future.done() and side.row in self.rows:  # answered apart (or failed there)
                self.rows.remove(side.row)
                return None
        while self.rows and self.rows[0].job.abandoned:
            drop(self.rows.pop(0))
        if not self.rows:
            return None
        row = self.rows[0]
        if self.concurrent:
            if row.prefilled is None:
                feed = self._answer_apart if self.apart is not None and len(row.job.rows) == 1 else self._feed_beside
                self.side = Beside(row, lambda: feed(row), lambda: row.job.abandoned, SIDE_THREAD)
                return None
        elif row.rest > self._last(row):
            if mergeable:
                try:
                    row.feed(self.model, self._last(row), self.k, self.evidence)
                except Exception as exc:  # handed to this request; the running rows go on
                    self._fail(row, exc)
            return None
        if not mergeable:
            return None
        return self.rows.pop(0)

    def _answer_apart(self, row: StagedRow) -> bool:
        """The whole one-row request of ``row`` in a loop of its own, in its thread (nothing left after)."""
        if self.apart is not None:
            self.apart(row)
        if not row.job.future.done():
            msg = "internal error: the request's own decode loop ended without answering it"
            raise RuntimeError(msg)
        return False

    def _feed_beside(self, row: StagedRow) -> bool:
        """One chunk of ``row`` in its thread (the last through :attr:`last`); whether more are left."""
        import torch

        with torch.inference_mode():
            if row.rest > self._last(row):
                row.feed(self.model, self._last(row), self.k, self.evidence)
                return True
            row.prefilled = self.last(row)
        return False

    def _fail(self, row: StagedRow, exc: BaseException) -> None:
        self.rows.remove(row)
        if not row.job.future.done():
            row.job.future.set_exception(exc)

    def wait(self) -> None:
        """Nothing but a staged prompt's thread runs: wait a little for it (new requests are looked for after)."""
        if self.side is not None and not self.side.done.is_set():
            self.side.done.wait(IDLE_POLL_S)

    def finish(self) -> None:
        """Stop the thread feeding a staged prompt, if one runs (at the end of its chunk)."""
        if self.side is not None:
            self.side.finish()
            self.side = None
