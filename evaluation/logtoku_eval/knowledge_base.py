"""The guard evaluation's knowledge base: an FAQ built from NQ-open, and how a retrieval attempt is made.

NQ-open has questions and short gold answers but no passages, so the knowledge base is built
from the dataset itself, as a FAQ: one entry ``"Q: {question} A: {first gold answer}."`` per
question. It holds the entries of a seeded ``coverage`` share of the evaluated questions and,
as distractors, the entries of every other NQ-open dev question (about 3000 real
question/answer pairs, many lexically close to an evaluated question). Retrieval is the
library's BM25 :class:`~logtoku_guard.guard.keyword_retriever.KeywordRetriever` (top ``passages`` entries)
queried with the user turn, and the augmented prompt is the policy's own
:meth:`~logtoku_guard.decision.policy.RetrieveSettings.prompt`: exactly what
:class:`~logtoku_guard.guard.guard.Guard` does. Coverage below 1 is the point: for an uncovered
question retrieval brings wrong answers to other questions, so it can turn a right answer
wrong, as a real, incomplete knowledge base does.

:class:`RagSetup` (knowledge base + retrieve settings + question template) makes the
retrieval prompt; :func:`run_rag` answers it greedily into its own cache (:func:`rag_cache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from logtoku_eval.cache import CachedGeneration, JsonlCache
from logtoku_eval.datasets import QAItem
from logtoku_eval.generate import PROMPT_TEMPLATE, GreedySpec, ProgressFn, greedy_cache, qa_prompt, run_greedy
from logtoku_guard.backends.base import Backend
from logtoku_guard.decision.policy import RetrieveSettings
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.guard.keyword_retriever import KeywordRetriever

__all__ = ["KnowledgeBase", "RagSetup", "build_knowledge_base", "faq_entry", "rag_cache", "run_rag"]


@dataclass(frozen=True)
class KnowledgeBase:
    """FAQ passages, and which evaluated questions have their own entry among them."""

    passages: tuple[str, ...]
    covered: frozenset[str]
    coverage: float
    seed: int

    @property
    def name(self) -> str:
        return f"faq-c{self.coverage:g}-s{self.seed}-n{len(self.passages)}"


def faq_entry(item: QAItem) -> str:
    """One knowledge-base entry: the question and its first gold answer."""
    return f"Q: {item.question} A: {item.correct[0]}."


def build_knowledge_base(items: Sequence[QAItem], pool: Sequence[QAItem], coverage: float, seed: int = 0) -> KnowledgeBase:
    """Entries for a seeded ``coverage`` share of ``items`` plus every ``pool`` question not in ``items``.

    The entries are shuffled (seeded) so an entry's position says nothing about coverage.
    """
    if not 0.0 <= coverage <= 1.0:
        msg = f"coverage must be in [0, 1] (the share of evaluated questions whose answer is in the base), got {coverage!r}"
        raise ConfigurationError(msg)
    if not items:
        msg = "no questions to build a knowledge base for; check the dataset path and --limit"
        raise ConfigurationError(msg)
    rng = np.random.default_rng(seed)
    n_cov = round(coverage * len(items))
    chosen = sorted(int(i) for i in rng.choice(len(items), size=n_cov, replace=False))
    ids = {it.id for it in items}
    entries = [faq_entry(items[i]) for i in chosen] + [faq_entry(p) for p in pool if p.id not in ids and p.correct]
    order = rng.permutation(len(entries))
    return KnowledgeBase(tuple(entries[i] for i in order), frozenset(items[i].id for i in chosen), coverage, seed)


@dataclass(frozen=True)
class RagSetup:
    """How the retrieval attempt is made: knowledge base, retrieve settings, question template."""

    kb: KnowledgeBase
    settings: RetrieveSettings = field(default_factory=RetrieveSettings)
    template: str = PROMPT_TEMPLATE

    @cached_property
    def retriever(self) -> KeywordRetriever:
        return KeywordRetriever(self.kb.passages, k=self.settings.passages)

    @property
    def dataset(self) -> str:
        return f"nq-open+{self.kb.name}-p{self.settings.passages}"

    @property
    def prompt_template(self) -> str:
        """The whole retrieval prompt as a template (what the cache records)."""
        return self.settings.context_template.replace("{question}", self.template)

    def user_turn(self, item: QAItem) -> str:
        """The closed-book user turn (what the guard retrieves with)."""
        return qa_prompt(item.question, self.template)

    def passages(self, item: QAItem) -> list[str]:
        return self.retriever.retrieve(self.user_turn(item))[: self.settings.passages]

    def prompt(self, item: QAItem) -> str:
        return self.settings.prompt(self.user_turn(item), self.passages(item))


def rag_cache(cache_dir: str | Path, model: str, setup: RagSetup, spec: GreedySpec | None = None) -> JsonlCache[CachedGeneration]:
    """The cache of the retrieval-augmented answers (one per knowledge base and passage count)."""
    return greedy_cache(cache_dir, model, setup.dataset, spec, template=setup.prompt_template)


def run_rag(
    backend: Backend,
    items: Sequence[QAItem],
    setup: RagSetup,
    cache: JsonlCache[CachedGeneration],
    *,
    spec: GreedySpec | None = None,
    batch_size: int = 8,
    on_progress: ProgressFn | None = None,
) -> list[CachedGeneration]:
    """Answer every question missing from ``cache`` with retrieved context (greedy, batched)."""
    return run_greedy(backend, items, cache, spec=spec, batch_size=batch_size, on_progress=on_progress, prompt_for=setup.prompt)
