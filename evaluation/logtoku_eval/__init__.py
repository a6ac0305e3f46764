"""The evaluation harness of logtoku-guard (distribution ``logtoku-guard-eval``): datasets,
generation cache, judges, methods, metrics, reports, plots, and the ``logtoku-guard eval`` commands
(:mod:`logtoku_eval.cli`). It builds on the core package and is never imported by it.

Data flow: dataset items -> cached greedy answers with raw top-5 logits (+ sampled answers
on a subset) -> judges label them -> each method's reliability, re-scored from the cache ->
AUROC / AUPRC / PRR / risk-coverage with bootstrap intervals -> markdown, JSON, PNG. The
guard end to end (:mod:`~logtoku_eval.rag`) replays retrieval guards at matched
budgets from cached closed-book and retrieval-augmented answers: knowledge base
(``knowledge_base``), replay (``replay``), live check (``live``), report (``guard_report``).

Framework-free: numpy for the maths; torch/transformers only where a model runs (generation,
the MiniLM embedding judge); matplotlib only for plots. Names are resolved
lazily, so ``import logtoku_eval`` (and the CLI) import none of them.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # datasets
    "QAItem": "datasets",
    "EmotionItem": "datasets",
    "DatasetUnavailableError": "datasets",
    "load_truthfulqa": "datasets",
    "load_nq_open": "datasets",
    "load_goemotions": "datasets",
    "load_emotion_names": "datasets",
    # cache and generation
    "CacheMeta": "cache",
    "JsonlCache": "cache",
    "CachedGeneration": "cache",
    "CachedToken": "cache",
    "CachedSamples": "cache",
    "CachedSample": "cache",
    "CachedLabelLogits": "cache",
    "PROMPT_TEMPLATE": "generate",
    "GreedySpec": "generate",
    "SamplingSpec": "generate",
    "greedy_cache": "generate",
    "samples_cache": "generate",
    "run_greedy": "generate",
    "run_sampling": "generate",
    # judges
    "Judge": "judges",
    "Verdict": "judges",
    "RougeJudge": "judges",
    "EmbeddingJudge": "judges",
    "MatchJudge": "judges",
    "LLMJudge": "judges",
    "TransformerEmbedder": "judges",
    "rouge_l": "judges",
    "normalize_answer": "judges",
    "BLEURT_NOTE": "judges",
    # methods and metrics
    "Method": "methods",
    "single_pass_methods": "methods",
    "single_pass_scores": "methods",
    "sampling_scores": "methods",
    "SAMPLING_METHODS": "methods",
    "auroc": "metrics",
    "auprc": "metrics",
    "prr": "metrics",
    "aurc": "metrics",
    "risk_coverage": "metrics",
    "roc_curve": "metrics",
    "bootstrap_ci": "metrics",
    "paired_bootstrap": "metrics",
    # reports and harness
    "EvalReport": "report",
    "ResultTable": "report",
    "evaluate_methods": "report",
    "QAConfig": "qa",
    "run_qa": "qa",
    "evaluate": "qa",
    "CrossFit": "crossfit",
    "cross_fit_guard": "crossfit",
    # the guard end to end
    "KnowledgeBase": "knowledge_base",
    "RagSetup": "knowledge_base",
    "build_knowledge_base": "knowledge_base",
    "Replay": "replay",
    "live_check": "live",
    "GuardEvalReport": "guard_report",
    "GuardEvalConfig": "rag",
    "evaluate_guard": "rag",
    "run_guard_eval": "rag",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'logtoku_eval' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(f"logtoku_eval.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
