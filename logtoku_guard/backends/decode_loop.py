"""Continuous batching: our own decode loop, whose rows join and leave a running batch between steps.

:class:`DecodeLoop` replaces transformers' ``generate`` for
:class:`~logtoku_guard.backends.transformers.TransformersBackend`. It owns one running batch
(:class:`KVBatch`): the left-padded attention mask, each row's last token and the model's
``DynamicCache``. Each step:

1. **decode**: one forward pass of the model over the live rows' last tokens (position ids
   from the mask: each row counts its own tokens, whatever its padding);
2. **join**: jobs queued meanwhile (:meth:`~logtoku_guard.backends.batching.Batcher.take_joiners`)
   are prefilled together (one forward over their left-padded prompts, the question's tokens
   scored on the way: :mod:`~logtoku_guard.backends.prompt_scoring`; prompts that begin with
   a cached prefix, the chat template and system prompt, prefill only the rest of their
   tokens on top of its keys and values: :mod:`~logtoku_guard.backends.prefix_cache`) and
   their KV cache is merged into the running one (the shorter side left-padded with masked
   zeros, then concatenated on the batch axis); a prompt longer than ``prefill_chunk`` is fed
   a chunk at a time on its own KV cache instead, and joins with its last chunk
   (:mod:`~logtoku_guard.backends.staged`), so it cannot stall the live rows: by default
   (``concurrent``) a thread of its own feeds it while this loop goes on (torch runs the two threads'
   forward passes at once; a one-row request is answered there whole, by a loop of its own), else
   this loop does, taking turns with the decoding rows;
3. **choose**: the raw logits of every row (the decoded ones, then the joiners' first-token
   logits) go to the :class:`~logtoku_guard.backends.recorder.StepRecorder` (top-K, AU/EU,
   stop strings, streaming, each row's end), then through the logits processors to the next
   token (greedy arg-max, or sampling);
4. **leave**: the rows that ended are removed from the mask, the cache and the recorder, and
   the columns that only padding still fills are cut off; their requests have already
   completed.

Each row gives the same tokens and scores as alone (float differences ~1e-6): padding is
masked out, positions are per row, and the model's own history-dependent logits processors
(repetition penalty, ``min_new_tokens``... from its ``generation_config``, built as ``generate``
builds them: :mod:`~logtoku_guard.backends.processors`) run per row on that row's own tokens.
Greedy and sampled rows share a batch: each sampled row runs the sampling warpers of its own
request (temperature, top-p and the config's others; rows of equal settings together, a dynamic
temperature schedule on the whole batch, since every row of a batch shares it) and draws from
its own ``torch.Generator`` (seeded by :func:`~logtoku_guard.backends.batching.row_seed`), so a
seeded row samples the same tokens whatever runs beside it (an exponential race,
:func:`~logtoku_guard.backends.processors.draw`, that the ~1e-5 float differences of a batched
forward pass flip only at a tie).

A cache whose layers are not all plain ``DynamicLayer`` (sliding-window or hybrid models)
cannot be merged: its batch still loses its ended rows, but nothing joins it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.batching import Job, JobRows, PreparedRow, row_seed
from logtoku_guard.backends.chunked_prefill import plan
from logtoku_guard.backends.hf_compat import cache_arg, returned_cache
from logtoku_guard.backends.kv_batch import KVBatch, mergeable
from logtoku_guard.backends.prefix_cache import PrefixCache, prefix_length
from logtoku_guard.backends.processors import (
    DynamicTemperatureLogitsWarper,
    draw,
    request_processors,
    row_processors,
    sampling_warpers,
)
from logtoku_guard.backends.prompt_scoring import for_batch, kept_positions, score_kept, shift_spans
from logtoku_guard.backends.recorder import Row, Scoring
from logtoku_guard.backends.staged import Prefilled, StagedPrompts, StagedRow
from logtoku_guard.types import DecodingOptions, Generation, TokenScore

if TYPE_CHECKING:
    import torch

__all__ = ["DecodeLoop", "LiveRow", "Scoring"]


@dataclass(eq=False)
class LiveRow:
    """One row of the running batch: which request it answers and its decoding state."""

    job: Job
    index: int  # the row's place in its job
    prepared: PreparedRow
    state: Row
    start: float  # perf_counter() when the row joined
    prompt_scores: tuple[TokenScore, ...] = ()
    first_token_s: float | None = None
    processors: Any = None  # the model's history-dependent logits processors for this row (None: none)
    history: list[int] = field(default_factory=list)  # prompt + generated ids, kept only with processors
    generator: Any = None  # the row's torch.Generator when its request samples (None: greedy)


class DecodeLoop(JobRows):
    """Runs one continuous batch: the initial jobs, and those that join it, until every row has ended.

    Args:
        model, tokenizer: the transformers model (decoder-only) and its tokenizer.
        scoring: what is recorded of each step (:class:`Scoring`).
        options: the batch's decoding settings: its dynamic temperature schedule is every row's
            (:meth:`~logtoku_guard.backends.batching.Job.key`); the rest is read per row, from
            each row's own request.
        take_joiners: ``take_joiners(live_rows)`` returns the jobs that join now (the
            batcher's :meth:`~logtoku_guard.backends.batching.Batcher.take_joiners`).
        finish: builds a row's :class:`~logtoku_guard.types.Generation` when it ends.
        prefix_cache: the backend's store of prompt-prefix KV caches (None: every prompt is prefilled whole).
        prefill_chunk: prompt tokens a long prompt is fed at a time, beside or between the live rows'
            decoding steps (:mod:`~logtoku_guard.backends.chunked_prefill`; None: prefilled whole).
        concurrent: a long prompt is fed by a thread of its own (:mod:`~logtoku_guard.backends.staged`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        scoring: Scoring,
        options: DecodingOptions,
        take_joiners: Callable[[int], list[Job]],
        finish: Callable[[LiveRow], Generation],
        prefix_cache: PrefixCache | None = None,
        prefill_chunk: int | None = None,
        concurrent: bool = False,
    ) -> None:
        import inspect

        self.model = model
        self.scoring = scoring
        self.options = options
        self.take_joiners = take_joiners
        self.finish = finish
        self.tokenizer = tokenizer
        self.prefix_cache = prefix_cache
        # chunks run through the decoder alone (no output head): a model without one is prefilled whole
        self.prefill_chunk = prefill_chunk if callable(getattr(model, "get_decoder", None)) else None
        self.pad = int(tokenizer.pad_token_id)
        self.device = model.device
        self.batch = KVBatch()
        self.live: list[LiveRow] = []
        self.results: dict[Job, dict[int, Generation]] = {}
        self.recorder = scoring.recorder(tokenizer, self._on_token, self._on_row_done)
        self.keep_last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        self.cache_arg = cache_arg(model)  # "cache" (transformers >= 5.24) or "past_key_values"
        # long prompts being prefilled a chunk at a time, oldest first (a prompt scored by a hook on the
        # decoder, for a model without logits_to_keep, is scored on the passes of this thread only: PromptCapture)
        self.staged = StagedPrompts(
            model, scoring.k, scoring.evidence, self.prefill_chunk, concurrent, self._forward_last, self._apart
        )
        self._build_processors()

    # -- the loop ------------------------------------------------------------------------------
    def run(self, jobs: list[Job]) -> None:
        """Generate ``jobs`` and every job that joins; each job's future completes as its rows end."""
        import torch

        joining = list(jobs)
        with torch.inference_mode():
            try:
                self._run(joining)
            finally:
                self.staged.finish()

    def _run(self, joining: list[Job]) -> None:
        """The loop of :meth:`run`, in its inference mode."""
        import torch

        while self.live or joining or self.staged:
            started = time.perf_counter()
            parts = [self._decode()] if self.live else []
            fed = [self.batch.last] if self.live and self.batch.last is not None else []
            joined = [self._prefill(joining) if joining else None]
            if self.staged.turn(bool(self.live)):
                chunk_start = time.perf_counter()
                joined.append(self._advance())
                self.staged.share.chunk_ran(time.perf_counter() - chunk_start)
                started += time.perf_counter() - chunk_start  # the chunk's own time is not decoding
            for part in joined:
                if part is not None:
                    parts.append(part[0])
                    fed.append(part[1])
            if parts:
                logits = parts[0] if len(parts) == 1 else torch.cat(parts)
                self._choose(logits, fed[0] if len(fed) == 1 else torch.cat(fed))
                self._leave()
            self.staged.share.decoded(time.perf_counter() - started)
            rows = len(self.live) + len(self.staged)
            joining = self.take_joiners(rows) if self.batch.mergeable or not (self.live or self.staged) else []
            if not self.live and not joining:
                self.staged.wait()  # only a staged prompt's thread may run: look for new requests now and then

    def _decode(self) -> torch.Tensor:
        """One forward pass over the live rows' last tokens; their ``(rows, vocab)`` logits."""
        import torch

        batch = self.batch
        if batch.mask is None or batch.last is None:
            msg = "internal error: decoding an empty batch"
            raise RuntimeError(msg)
        positions = batch.mask.sum(dim=-1, keepdim=True)  # each row's real tokens so far
        mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch), 1))], dim=1)
        out = self.model(
            input_ids=batch.last[:, None],
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_arg: batch.cache},
        )
        batch.mask, batch.cache = mask, returned_cache(out)
        return out.logits[:, -1, :]

    def _prefill(self, jobs: list[Job]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Prefill ``jobs``' prompts and merge them into the running batch.

        Rows whose prompts begin with the same cacheable prefix
        (:func:`~logtoku_guard.backends.prefix_cache.prefix_length`) are prefilled together in
        one forward over the rest of their prompts, on top of the prefix's cached keys and
        values (computed once, on a miss). Returns their first-token ``(rows, vocab)`` logits
        and last prompt tokens, or None when every prefill failed (the jobs of a failed group
        fail with its error; the running rows go on).
        """
        import torch

        whole, longer = plan([((job, i, p), len(p.ids), 0) for job in jobs for i, p in enumerate(job.rows)], self.prefill_chunk)
        now = time.perf_counter()
        self.staged.rows.extend(StagedRow(job, i, p, now) for job, i, p in longer)
        groups: dict[tuple[int, ...], list[tuple[Job, int, PreparedRow]]] = {}
        for job, i, p in whole:
            n = prefix_length(p.span) if self.prefix_cache is not None else 0
            groups.setdefault(tuple(p.ids[:n]), []).append((job, i, p))
        parts = [part for key, rows in groups.items() if (part := self._prefill_group(key, rows)) is not None]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return torch.cat([logits for logits, _ in parts]), torch.cat([last for _, last in parts])

    def _advance(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Feed the oldest staged (long) prompt (:class:`~logtoku_guard.backends.staged.StagedPrompts`);
        when only its last chunk is left, prefill it into the batch: its first-token logits and last token."""
        row = self.staged.advance(self.batch.mergeable or not self.live, self._drop)
        if row is None:
            return None
        rows = [(row.job, row.index, row.prepared)]
        if row.prefilled is not None:  # its last chunk's forward ran in its thread too
            return self._join_group(rows, row.prefilled, row.start, row)
        return self._prefill_group((), rows, row)

    def _apart(self, row: StagedRow) -> None:
        """Answer ``row``'s request (one row) in a loop of its own, prefill and decoding, alone: its long
        prompt then never widens this loop's batch (run by the staged row's thread)."""
        options, chunk = row.job.options, self.prefill_chunk
        DecodeLoop(self.model, self.tokenizer, self.scoring, options, lambda _: [], self.finish, None, chunk).run([row.job])

    def _forward_last(self, row: StagedRow) -> Prefilled:
        """The forward of a staged row's last chunk (run by its thread), not joined yet."""
        return self._forward_group((), [(row.job, row.index, row.prepared)], row)

    def _drop(self, row: StagedRow) -> None:
        """A staged row whose request went: a cancelled one ends ``"cancelled"`` with no tokens."""
        if not row.job.future.done():
            state = Row.cancelled(row.job, row.prepared.limit)
            self._complete(LiveRow(row.job, row.index, row.prepared, state, row.start, tuple(row.scores)), state)

    def _prefill_group(
        self, key: tuple[int, ...], rows: list[tuple[Job, int, PreparedRow]], staged: StagedRow | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Prefill ``rows``, whose prompts all begin with the tokens ``key``, in one forward (or
        the rest of the ``staged`` row's prompt, on top of the chunks in its own cache) and let them
        join the batch: their first-token logits and last prompt tokens (None: the forward failed,
        and these requests got the error)."""
        start = time.perf_counter() if staged is None else staged.start
        try:
            done = self._forward_group(key, rows, staged)
        except Exception as exc:  # handed to these requests; the running rows go on
            for job, _, _ in rows:
                if not job.future.done():
                    job.future.set_exception(exc)
            return None
        return self._join_group(rows, done, start, staged)

    def _forward_group(
        self, key: tuple[int, ...], rows: list[tuple[Job, int, PreparedRow]], staged: StagedRow | None
    ) -> Prefilled:
        """The forward of :meth:`_prefill_group`, its question tokens scored; nothing joins the batch yet.
        It only reads this loop's settings, so a staged row's thread runs it too
        (:class:`~logtoku_guard.backends.staged.StagedPrompts`)."""
        import torch
        from transformers import DynamicCache

        prefix = self._prefix(key) if key else None
        n = len(key) if prefix is not None else (staged.fed if staged is not None else 0)
        rest = [p.ids[n:] for _, _, p in rows]
        longest = max(len(r) for r in rest)
        ids = torch.tensor([[self.pad] * (longest - len(r)) + r for r in rest], dtype=torch.long).to(self.device)
        own = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rest], dtype=torch.long).to(self.device)
        positions = (own.cumsum(dim=-1) - 1 + n).masked_fill(own == 0, 0)  # as generate() derives them
        mask, past = own, staged.cache if staged is not None else None
        if n:
            mask = torch.cat([own.new_ones((len(rows), n)), own], dim=1)
        if prefix is not None:
            past = DynamicCache([(k.expand(len(rows), -1, -1, -1), v.expand(len(rows), -1, -1, -1)) for k, v in prefix])
        # each span moves right by the row's padding and left by the n tokens already cached
        # (a staged row's earlier chunks scored the question tokens up to position n)
        spans = shift_spans(
            [
                (p.span.part(n + 1) if p.score_prompt and p.span is not None else None, longest - len(r) - n)
                for (_, _, p), r in zip(rows, rest, strict=True)
            ]
        )
        score, k, evidence = any(span is not None for span in spans), self.scoring.k, self.scoring.evidence
        keep = kept_positions(spans, longest) if score and self.keep_last else None
        capture = for_batch(self.model, ids, spans, k, evidence) if score and keep is None else None
        handle = self.model.get_decoder().register_forward_hook(capture.hook) if capture is not None else None
        logits_to_keep = {"logits_to_keep": torch.tensor(keep, device=self.device)} if keep else self.keep_last
        try:
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self.cache_arg: past},
                **logits_to_keep,
            )
        finally:
            if handle is not None:
                handle.remove()
        if keep is not None:
            prompt_scores = [score_kept(out.logits[b], keep, ids[b], span, k, evidence) for b, span in enumerate(spans)]
        else:
            prompt_scores = capture.scores if capture is not None else [() for _ in rows]
        return Prefilled(mask, returned_cache(out), out.logits[:, -1, :], ids[:, -1], prompt_scores)

    def _join_group(
        self, rows: list[tuple[Job, int, PreparedRow]], done: Prefilled, start: float, staged: StagedRow | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows``, prefilled (``done``), join the batch: their first-token logits and last prompt tokens."""
        import torch

        self.batch.extend(done.mask, done.cache)
        prompt_scores = done.prompt_scores
        for b, (job, i, p) in enumerate(rows):
            state = Row(stop=job.options.stop, model_stop=job.model_stop, limit=p.limit, cancel=job.cancel, grammar=p.grammar)
            before = tuple(staged.scores) if staged is not None else ()  # scored by its earlier chunks
            row = LiveRow(job, i, p, state, start, before + tuple(prompt_scores[b]))
            row.processors = self._row_processors(job, p)
            if row.processors is not None:
                row.history = list(p.ids)
            if job.options.sampling:
                row.generator = torch.Generator(device=self.device)
                seed = row_seed(job.options.seed, i)
                if seed is None:
                    row.generator.seed()  # a fresh random stream
                else:
                    row.generator.manual_seed(seed % 2**64)
            self.live.append(row)
            self.recorder.rows.append(state)
        return done.logits, done.last

    def _prefix(self, key: tuple[int, ...]) -> tuple[tuple[torch.Tensor, torch.Tensor], ...] | None:
        """The cached keys and values of the prompt prefix ``key`` (prefilled now on a miss);
        None when the model's cache cannot be reused this way (then prefix caching stops)."""
        import torch

        if self.prefix_cache is None:
            return None
        layers = self.prefix_cache.get(key)
        if layers is None:
            get_decoder = getattr(self.model, "get_decoder", None)
            decoder = get_decoder() if callable(get_decoder) else None
            if decoder is None:
                self.prefix_cache = None  # no decoder to run without the output head
                return None
            ids = torch.tensor([key], dtype=torch.long, device=self.device)
            out = decoder(  # keys and values only: the output head is not needed
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                position_ids=torch.arange(len(key), device=self.device)[None],
                use_cache=True,
            )
            cache = returned_cache(out)
            if not mergeable(cache):
                self.prefix_cache = None  # sliding-window or hybrid cache: whole prompts from now on
                return None
            layers = tuple((layer.keys, layer.values) for layer in cache.layers)
            self.prefix_cache.put(key, layers)
        return layers

    def _choose(self, logits: torch.Tensor, fed: torch.Tensor) -> None:
        """Record the step's raw logits, pick each row's next token, let the recorder end rows.

        The grammar mask of constrained rows comes after the recording (AU/EU and log p are the
        raw logits'), after the model's own processors and before the sampling warpers.
        """
        import torch

        self.recorder.record(logits)
        scores = logits.float()
        if any(row.processors is not None for row in self.live):
            scores = torch.cat([self._apply_row(row, scores[b : b + 1]) for b, row in enumerate(self.live)])
        if any(row.state.grammar is not None for row in self.live):
            scores = self._mask(scores)
        sampled = [b for b, row in enumerate(self.live) if row.generator is not None]
        if sampled:
            scores = self._warp(scores.clone() if scores is logits else scores, fed, sampled)
        chosen = torch.argmax(scores, dim=-1)
        for b in sampled:  # each from its own stream (an exponential race: robust to float noise)
            chosen[b] = draw(scores[b : b + 1], self.live[b].generator)
        now = time.perf_counter()
        for row in self.live:
            if row.first_token_s is None:
                row.first_token_s = now - row.start
        self.batch.last = chosen
        self.recorder(chosen[:, None])
        for row, token in zip(self.live, chosen.tolist(), strict=True):
            if row.processors is not None:
                row.history.append(int(token))

    def _warp(self, scores: torch.Tensor, fed: torch.Tensor, sampled: list[int]) -> torch.Tensor:
        """``scores`` with each sampled row's warpers applied: the batch's dynamic temperature on
        every row (all of them sample under it), then each request's temperature and top-p, rows
        of equal settings together (greedy rows are left as they are: only their arg-max is read)."""
        import torch

        if self.dynamic is not None:
            scores = self.dynamic(fed[:, None], scores)  # type: ignore[arg-type]
        groups: dict[tuple[float, float], list[int]] = {}
        for b in sampled:
            o = self.live[b].job.options
            groups.setdefault((1.0 if o.dynamic is not None else float(o.temperature), float(o.top_p)), []).append(b)
        for settings, rows in groups.items():
            warpers = self.warpers.get(settings)
            if warpers is None:
                config = copy.deepcopy(self.config)
                config.update(do_sample=True, temperature=settings[0], top_p=settings[1], top_k=0)
                warpers = self.warpers[settings] = sampling_warpers(config, self.device)
            if not warpers:
                continue
            if len(rows) == len(scores):
                scores = warpers(fed[:, None], scores)  # type: ignore[arg-type]
                continue
            index = torch.tensor(rows, dtype=torch.long, device=scores.device)
            scores[index] = warpers(fed[index][:, None], scores[index])  # type: ignore[arg-type]
        return scores

    def _mask(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` with every token the rows' grammars disallow set to ``-inf`` (a new tensor: the raw logits stay)."""
        import torch

        from logtoku_guard.tools.grammar import allowed_tokens

        allowed = allowed_tokens([row.state.grammar for row in self.live], scores.shape[-1])
        if allowed is None:
            return scores
        return scores.masked_fill(~torch.from_numpy(allowed).to(scores.device), float("-inf"))

    def _leave(self) -> None:
        """Drop the rows that ended (or whose request already failed) from the batch."""
        keep = [b for b, row in enumerate(self.live) if not row.state.done and not row.job.future.done()]
        if len(keep) == len(self.live):
            return
        self.batch.keep(keep)
        self.live = [self.live[b] for b in keep]
        self.recorder.rows = [self.recorder.rows[b] for b in keep]

    # -- logits processors ---------------------------------------------------------------------
    def _build_processors(self) -> None:
        """The model's logits processors, built from its generation config as ``generate`` builds them.

        ``has_row_processors``: whether the ones that read a row's tokens (repetition penalty,
        ``min_new_tokens``...) exist; they run per row (:func:`~logtoku_guard.backends.processors.row_processors`).
        ``dynamic``: the batch's dynamic temperature warper (None without a schedule).
        ``warpers``: the sampling warpers of each ``(temperature, top_p)`` that a sampled row asked
        for (temperature, top-p and the config's others, row-wise), built when first needed.
        """
        config = copy.deepcopy(self.model.generation_config)
        config.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        config.update(eos_token_id=sorted(self.scoring.eos_ids) or None, pad_token_id=self.pad)
        self.config = config
        self.dynamic: DynamicTemperatureLogitsWarper | None = None
        if self.options.dynamic is not None:
            rec = self.recorder
            self.dynamic = DynamicTemperatureLogitsWarper(self.options.dynamic, rec.current_eu, rec.record_temperatures)
        self.has_row_processors = len(row_processors(config, [self.pad], 1, self.device)) > 0
        self.warpers: dict[tuple[float, float], Any] = {}

    def _row_processors(self, job: Job, p: PreparedRow) -> Any:
        """A row's history-dependent processors: the model's own (its generation config), then its
        request's logit bias and penalties (:func:`~logtoku_guard.backends.processors.request_processors`);
        None when there are none."""
        from transformers import LogitsProcessorList

        out = row_processors(self.config, p.ids, p.limit, self.device) if self.has_row_processors else LogitsProcessorList()
        out.extend(request_processors(job.options, len(p.ids)))
        return out or None

    def _apply_row(self, row: LiveRow, scores: torch.Tensor) -> torch.Tensor:
        import torch

        if row.processors is None:
            return scores
        ids = torch.tensor([row.history], dtype=torch.long, device=scores.device)
        return row.processors(ids, scores.clone())
