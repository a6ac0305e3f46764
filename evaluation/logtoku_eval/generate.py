"""Fill the generation caches: greedy answers with raw top-K logits, and sampled answers.

Protocol of the paper (Ma et al. 2025, arXiv 2502.00290): prompt ``"Answer the question concisely. Q:
{question} A:"`` (sent as the user turn; the model's chat template is applied by the
backend), greedy decoding, at most 64 new tokens, stop at the first newline or EOS. Raw
top-K logits are stored with K = 5 so K = 2 and K = 5 are re-scored from one run.
Sampling baselines: 10 answers at temperature 0.5 per question (same prompt, same stops).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
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
        base = f"greedy-max{self.max_new_tokens}"
        return base if self.stop == ("\n",) else base + ("-nostop" if not self.stop else f"-stop{len(self.stop)}")

    def options(self) -> DecodingOptions:
        return DecodingOptions(max_new_tokens=self.max_new_tokens, stop=self.stop)


SERVING = GreedySpec(max_new_tokens=64, stop=())
"""Answers as the guard sees them in ``ask`` and ``calibrate``: greedy, 64 tokens, no stop string."""
SERVING_TEMPLATE = "{question}"
"""The question alone as the user turn (the chat template is the backend's)."""


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
    spec: GreedySpec | None = None,
    k_stored: int = K_STORED,
    template: str = PROMPT_TEMPLATE,
) -> JsonlCache[CachedGeneration]:
    """The greedy-generation cache of ``model`` on ``dataset``."""
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
    if getattr(backend, "k", None) != cache.meta.k_stored:
        k = cache.meta.k_stored
        msg = f"the backend keeps k={getattr(backend, 'k', None)} logits per token but the cache stores k={k}; load it with k={k}"
        raise ConfigurationError(msg)
    if batch_size < 1:
        msg = f"batch_size must be a positive integer, got {batch_size!r}"
        raise ConfigurationError(msg)
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
