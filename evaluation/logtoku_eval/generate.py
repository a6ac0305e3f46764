"""Fill the generation caches: greedy answers with raw top-K logits, and sampled answers.

Protocol of the paper (Ma et al. 2025, arXiv 2502.00290): prompt ``"Answer the question concisely. Q:
{question} A:"`` (sent as the user turn; the model's chat template is applied by the
backend), greedy decoding, at most 64 new tokens, stop at the first newline or EOS. Raw
top-K logits are stored with K = 5 so K = 2 and K = 5 are re-scored from one run.
Sampling baselines: 10 answers at temperature 0.5 per question (same prompt, same stops).
:class:`SampledSpec` is one sampled answer per question with every token's top-K logits (as
``serve --default-temperature 1`` answers a request that leaves ``temperature`` out: OpenAI's default), each question drawn
from its own seeded stream (:func:`run_answers`).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from logtoku_eval.cache import (
    CachedGeneration,
    CachedSample,
    CachedSamples,
    CachedToken,
    CacheMeta,
    JsonlCache,
)
from logtoku_eval.datasets import QAItem
from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.types import DecodingOptions, Generation, Prompt, TokenScore

PROMPT_TEMPLATE = "Answer the question concisely. Q: {question} A:"
K_STORED = 5

ProgressFn = Callable[[int], None]
"""Called with the number of questions just finished (for a progress bar)."""


def qa_prompt(question: str, template: str = PROMPT_TEMPLATE) -> str:
    """The paper's TruthfulQA prompt for one question."""
    return template.format(question=question)


@dataclass(frozen=True)
class GreedySpec:
    """Greedy decoding: at most ``max_new_tokens``, stop at ``stop`` or EOS.

    The default is the paper's (stop at the first newline); :data:`SERVING` answers as
    ``logtoku-guard ask`` and ``calibrate`` do (no stop string, the question alone as the user
    turn), for benchmarks of what users see.
    """

    max_new_tokens: int = 64
    stop: tuple[str, ...] = ("\n",)

    @property
    def name(self) -> str:
        return f"greedy-max{self.max_new_tokens}{_stop_suffix(self.stop)}"

    def options(self) -> DecodingOptions:
        return DecodingOptions(max_new_tokens=self.max_new_tokens, stop=self.stop)


SERVING = GreedySpec(max_new_tokens=64, stop=())
"""Answers as the guard sees them in ``ask`` and ``calibrate``: greedy, 64 tokens, no stop string."""
SERVING_TEMPLATE = "{question}"
"""The question alone as the user turn (the chat template is the backend's)."""


def _stop_suffix(stop: tuple[str, ...]) -> str:
    return "" if stop == ("\n",) else ("-nostop" if not stop else f"-stop{len(stop)}")


@dataclass(frozen=True)
class SampledSpec:
    """One sampled answer per question, every token's top-K logits kept (as :class:`GreedySpec`'s).

    ``temperature`` (at least :data:`~logtoku_guard.types.GREEDY_BELOW`, below which every backend
    decodes greedily: use :class:`GreedySpec`), top-p 1, at most ``max_new_tokens``, stop at ``stop``
    or EOS: with the defaults, what ``logtoku-guard serve`` does with a chat request that sends no
    ``temperature`` and no ``max_tokens`` (OpenAI's temperature 1, the server's 256 tokens). The
    draws come from the backend's own sampler (:func:`logtoku_guard.backends.processors.draw`, the
    served one). Question ``id`` draws from the stream seeded with :meth:`seed_of` (a hash of
    ``seed`` and the id), so its answer does not depend on the questions asked beside it, the
    batch size, ``--limit`` or the split; the cache file is named by every field (:attr:`name`).
    """

    temperature: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from logtoku_guard.types import GREEDY_BELOW

        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t >= GREEDY_BELOW):
            msg = (
                f"a sampled answer needs a finite temperature of at least {GREEDY_BELOW}, got {t!r}; "
                "use GreedySpec for greedy answers"
            )
            raise ConfigurationError(msg)
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            msg = f"max_new_tokens must be a positive integer, got {n!r}"
            raise ConfigurationError(msg)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            msg = f"seed must be a non-negative integer, got {self.seed!r}"
            raise ConfigurationError(msg)

    @property
    def name(self) -> str:
        return f"sampled-t{float(self.temperature)!r}-max{self.max_new_tokens}{_stop_suffix(self.stop)}-seed{self.seed}"

    def seed_of(self, question_id: str) -> int:
        """The seed of question ``question_id``'s random stream (64 bits of SHA-256 of the seed and the id)."""
        digest = hashlib.sha256(f"{self.seed}\x00{question_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big")

    def options(self, question_id: str) -> DecodingOptions:
        return DecodingOptions(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=self.seed_of(question_id),
            stop=self.stop,
        )


AnswerSpec = GreedySpec | SampledSpec
"""How the answers of a generation cache were decoded (:func:`greedy_cache`, :func:`run_answers`)."""


@dataclass(frozen=True)
class SamplingSpec:
    """``n`` sampled answers per question at ``temperature`` (paper: 10 at 0.5, 64 tokens).

    The seed of question ``i`` (its position in the dataset) is ``seed + i``, so a resumed or
    partial run samples exactly what a full run would.
    """

    n: int = 10
    temperature: float = 0.5
    max_new_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 2:
            msg = f"the sampling baselines need at least 2 samples per question, got n={self.n!r}; the paper uses 10"
            raise ConfigurationError(msg)
        if not self.temperature > 0:
            msg = f"sampling temperature must be > 0, got {self.temperature!r}; the paper uses 0.5"
            raise ConfigurationError(msg)

    @property
    def name(self) -> str:
        return f"sample-t{self.temperature:g}-n{self.n}-max{self.max_new_tokens}-seed{self.seed}"

    def options(self, index: int) -> DecodingOptions:
        return DecodingOptions(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed + index, stop=("\n",)
        )


def _model_name(backend: object) -> str:
    return str(getattr(backend, "model_name", "model"))


def greedy_cache(
    cache_dir: str | os.PathLike[str],
    model: str,
    dataset: str,
    spec: AnswerSpec | None = None,
    k_stored: int = K_STORED,
    template: str = PROMPT_TEMPLATE,
) -> JsonlCache[CachedGeneration]:
    """The answers cache of ``model`` on ``dataset``: greedy (the default) or sampled (a :class:`SampledSpec`),
    in a file named by the decoding, so greedy and sampled answers never share one."""
    meta = CacheMeta(model, dataset, k_stored, (spec or GreedySpec()).name, template, CachedGeneration.kind)
    return JsonlCache.in_dir(cache_dir, meta, CachedGeneration)


def samples_cache(
    cache_dir: str | os.PathLike[str],
    model: str,
    dataset: str,
    spec: SamplingSpec | None = None,
    template: str = PROMPT_TEMPLATE,
) -> JsonlCache[CachedSamples]:
    """The sampled-answers cache of ``model`` on ``dataset`` (no logits stored: K = 0)."""
    meta = CacheMeta(model, dataset, 0, (spec or SamplingSpec()).name, template, CachedSamples.kind)
    return JsonlCache.in_dir(cache_dir, meta, CachedSamples)


def to_cached(item: QAItem, generation: Generation) -> CachedGeneration:
    """A backend's :class:`Generation` as a cache record (with its prompt-side scores)."""
    return CachedGeneration(
        id=item.id,
        question=item.question,
        answer=generation.text.strip(),
        finish_reason=generation.finish_reason,
        tokens=tuple(_cached_token(t) for t in generation.tokens),
        prompt_tokens=tuple(_cached_token(t) for t in generation.prompt_scores),
    )


def _cached_token(t: TokenScore) -> CachedToken:
    return CachedToken(
        id=t.id,
        text=t.text,
        top_logits=tuple(float(v) for v in t.top_logits),
        top_ids=tuple(int(i) for i in t.top_ids),
        logprob=float(t.logprob),
        entropy=float(t.entropy),
    )


def run_greedy(
    backend: Backend,
    items: Sequence[QAItem],
    cache: JsonlCache[CachedGeneration],
    *,
    spec: GreedySpec | None = None,
    batch_size: int = 8,
    on_progress: ProgressFn | None = None,
    prompt_for: Callable[[QAItem], Prompt] | None = None,
) -> list[CachedGeneration]:
    """Generate the greedy answers missing from ``cache`` (in batches), append them, return all.

    ``backend`` is any :class:`~logtoku_guard.backends.base.Backend` whose ``k`` equals the
    cache's ``k_stored`` (``TransformersBackend(k=5)`` for the default cache). ``prompt_for``
    builds each question's prompt (default: the cache's template around the question); a
    custom one must be what the cache's ``prompt_template`` names, or the cache lies.
    """
    spec = spec or GreedySpec()
    _check_run(backend, cache, batch_size)
    done = cache.done_ids()
    if on_progress is not None and done:
        on_progress(sum(1 for it in items if it.id in done))
    todo = [it for it in items if it.id not in done]
    options = spec.options()
    template = cache.meta.prompt_template
    build = prompt_for or (lambda it: qa_prompt(it.question, template))
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        generations = backend.batch([build(it) for it in chunk], options)
        cache.append(to_cached(it, g) for it, g in zip(chunk, generations))
        if on_progress is not None:
            on_progress(len(chunk))
    return cache.records([it.id for it in items])


def run_answers(
    backend: Backend,
    items: Sequence[QAItem],
    cache: JsonlCache[CachedGeneration],
    *,
    spec: AnswerSpec | None = None,
    batch_size: int = 8,
    on_progress: ProgressFn | None = None,
) -> list[CachedGeneration]:
    """The answers missing from ``cache``, decoded as ``spec`` says, appended; returns all of ``items``'.

    A :class:`GreedySpec` goes to :func:`run_greedy`. A :class:`SampledSpec` asks one
    ``backend.generate`` per question, its own seed in its options (:meth:`SampledSpec.options`), at
    most ``batch_size`` at a time from as many threads (a batching backend runs them as rows of one
    batch, each row drawing from its own seeded stream); each answer is appended as soon as it is
    made (in the order they finish: the cache is keyed by id), so an interrupted run resumes.
    ``spec`` must be the one the cache's file is named for, or the cache lies.
    """
    spec = spec or GreedySpec()
    if cache.meta.decoding != spec.name:
        msg = (
            f"the cache {str(cache.path)!r} holds {cache.meta.decoding!r} answers, not {spec.name!r}; "
            "open the cache for this spec (greedy_cache(..., spec))"
        )
        raise ConfigurationError(msg)
    if isinstance(spec, GreedySpec):
        return run_greedy(backend, items, cache, spec=spec, batch_size=batch_size, on_progress=on_progress)
    _check_run(backend, cache, batch_size)
    done = cache.done_ids()
    if on_progress is not None and done:
        on_progress(sum(1 for it in items if it.id in done))
    todo = list({it.id: it for it in items if it.id not in done}.values())
    template = cache.meta.prompt_template
    if todo:
        pool = ThreadPoolExecutor(max_workers=min(batch_size, len(todo)), thread_name_prefix="logtoku-eval-sample")
        futures: dict[Future[Generation], QAItem] = {}
        try:
            for it in todo:
                futures[pool.submit(backend.generate, qa_prompt(it.question, template), spec.options(it.id))] = it
            for future in as_completed(futures):
                it = futures[future]
                cache.append([to_cached(it, future.result())])
                if on_progress is not None:
                    on_progress(1)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return cache.records([it.id for it in items])


def _check_run(backend: Backend, cache: JsonlCache[CachedGeneration], batch_size: int) -> None:
    if getattr(backend, "k", None) != cache.meta.k_stored:
        k = cache.meta.k_stored
        msg = f"the backend keeps k={getattr(backend, 'k', None)} logits per token but the cache stores k={k}; load it with k={k}"
        raise ConfigurationError(msg)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        msg = f"batch_size must be a positive integer, got {batch_size!r}"
        raise ConfigurationError(msg)


def _sample_record(item: QAItem, generations: Sequence[Generation]) -> CachedSamples:
    samples = []
    for g in generations:
        n = len(g.tokens)
        nll = -sum(t.logprob for t in g.tokens) / n if n else float("nan")
        samples.append(CachedSample(text=g.text.strip(), n_tokens=n, nll=nll))
    return CachedSamples(id=item.id, question=item.question, samples=tuple(samples))


def run_sampling(
    backend: Backend,
    items: Sequence[QAItem],
    cache: JsonlCache[CachedSamples],
    *,
    spec: SamplingSpec | None = None,
    positions: Sequence[int] | None = None,
    on_progress: ProgressFn | None = None,
) -> list[CachedSamples]:
    """Sample ``spec.n`` answers per question missing from ``cache`` (one batch per question).

    ``positions[i]`` is item ``i``'s index in the full dataset (its seed offset); by default
    the index in ``items``. The NLL uses the raw-logit softmax (temperature 1), as the
    paper's LN-entropy does.
    """
    spec = spec or SamplingSpec()
    pos = list(positions) if positions is not None else list(range(len(items)))
    if len(pos) != len(items):
        msg = f"positions must give one dataset index per item, got {len(pos)} for {len(items)} items"
        raise ConfigurationError(msg)
    done = cache.done_ids()
    if on_progress is not None and done:
        on_progress(sum(1 for it in items if it.id in done))
    template = cache.meta.prompt_template
    for item, index in zip(items, pos):
        if item.id in done:
            continue
        prompt = qa_prompt(item.question, template)
        generations = backend.batch([prompt] * spec.n, spec.options(index))
        cache.append([_sample_record(item, generations)])
        if on_progress is not None:
            on_progress(1)
    return cache.records([it.id for it in items])
