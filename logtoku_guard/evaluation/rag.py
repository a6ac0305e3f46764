"""The guard end to end (issue 6, part 4): accuracy against retrievals spent, on NQ-open.

Design. NQ-open has questions and short gold answers but no passages, so the knowledge base
is built from the dataset itself, as a FAQ: one entry ``"Q: {question} A: {first gold
answer}."`` per question. It holds the entries of a seeded ``coverage`` share of the
evaluated questions and, as distractors, the entries of every other NQ-open dev question
(about 3000 real question/answer pairs, many lexically close to an evaluated question).
Retrieval is the library's BM25 :class:`~logtoku_guard.retrieval.KeywordRetriever` (top
``passages`` entries) queried with the user turn, and the augmented prompt is the policy's
own :meth:`~logtoku_guard.policy.RetrieveSettings.prompt`: exactly what
:class:`~logtoku_guard.guard.Guard` does. Coverage below 1 is the point: for an uncovered
question retrieval brings wrong answers to other questions, so it can turn a right answer
wrong, as a real, incomplete knowledge base does.

Replay. Every question is answered twice, greedily, and both are cached: closed book (the
cache of ``eval nq-open``) and with retrieval. A guard with one rule "retrieve when <signal>
< t" (one attempt, then pass) answers each question with one of the two, so its accuracy at
any threshold is replayed exactly from the caches, for every signal and budget, without
generating again. Budgets are matched: at budget ``b`` each signal retrieves for its
``round(b n)`` least reliable closed-book answers (in-sample thresholds; a NaN score never
fires, as in the guard). ``random`` is the expected accuracy of retrieving ``round(b n)``
questions at random; ``oracle`` retrieves where it helps first and where it hurts last (an
upper bound). :func:`live_check` runs the real :class:`~logtoku_guard.guard.Guard` on the first
questions and counts where its decisions and answers agree with the replay.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.evaluation.cache import CachedGeneration, JsonlCache
from logtoku_guard.evaluation.datasets import QAItem
from logtoku_guard.evaluation.generate import PROMPT_TEMPLATE, GreedySpec, ProgressFn, greedy_cache, qa_prompt, run_greedy
from logtoku_guard.evaluation.judges import MatchJudge
from logtoku_guard.evaluation.methods import HEADLINE, single_pass_scores
from logtoku_guard.evaluation.metrics import PairedDifference, bootstrap_indices, paired_difference, percentile_interval
from logtoku_guard.policy import RetrieveSettings
from logtoku_guard.retrieval import KeywordRetriever
from logtoku_guard.uncertainty import DEFAULT_TOP_N

SIGNALS: dict[str, tuple[str, str]] = {
    "logtoku": (HEADLINE, "reliability"),
    "entropy": ("entropy-top25", "entropy_reliability"),
    "probability": ("probability-top25", "probability_reliability"),
}
"""Guard signal -> (the evaluation method re-scored from the cache, the guard's statistic)."""

DEFAULT_BUDGETS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
CURVE_BUDGETS = np.linspace(0.0, 1.0, 51)


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
    backend: Any,
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


def _json_fields(obj: Any) -> dict[str, Any]:
    """A flat dataclass as JSON: non-finite floats become ``None``."""
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in obj.__dict__.items()}


# -- replay --------------------------------------------------------------------------------------------
def retrieve_mask(scores: np.ndarray, n_retrieve: int) -> np.ndarray:
    """Retrieve for the ``n_retrieve`` lowest finite scores (ties by position); NaN never retrieves."""
    s = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(s)
    order = np.argsort(np.where(finite, s, np.inf), kind="stable")[: min(n_retrieve, int(finite.sum()))]
    mask = np.zeros(s.size, dtype=bool)
    mask[order] = True
    return mask


def threshold_for(scores: np.ndarray, mask: np.ndarray) -> float:
    """A threshold ``t`` with ``score < t`` exactly on ``mask`` (midpoint between the two sides).

    NaN when no threshold separates them (ties across the boundary); the guard then retrieves
    for every tied score, which the live check reports.
    """
    s = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(s)
    inside, outside = s[mask], s[finite & ~mask]
    if inside.size == 0:
        return float(np.min(s[finite])) - 1.0 if finite.any() else 0.0
    if outside.size == 0:
        return float(np.max(inside)) + 1.0
    lo, hi = float(np.max(inside)), float(np.min(outside))
    return (lo + hi) / 2.0 if lo < hi else math.nan


def oracle_mask(closed: np.ndarray, rag: np.ndarray, n_retrieve: int) -> np.ndarray:
    """The best ``n_retrieve`` retrievals: where they help, then neutral ones, where they hurt last."""
    priority = np.where(~closed & rag, 0, np.where(closed == rag, 1, 2))
    order = np.argsort(priority, kind="stable")[:n_retrieve]
    mask = np.zeros(closed.size, dtype=bool)
    mask[order] = True
    return mask


@dataclass(frozen=True)
class BudgetPoint:
    """One guard at one retrieval budget."""

    guard: str
    budget: float
    retrievals: int
    accuracy: float
    low: float = math.nan
    high: float = math.nan
    helped: int = 0
    hurt: int = 0
    threshold: float = math.nan

    def to_json(self) -> dict[str, Any]:
        return _json_fields(self)


@dataclass(frozen=True)
class Replay:
    """Closed-book and retrieval answers, their labels and the closed-book signals of every guard."""

    ids: tuple[str, ...]
    closed: np.ndarray
    rag: np.ndarray
    scores: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.closed.shape != (n,) or self.rag.shape != (n,) or any(v.shape != (n,) for v in self.scores.values()):
            msg = f"every label and score array must have one value per question ({n})"
            raise ConfigurationError(msg)

    @property
    def n(self) -> int:
        return len(self.ids)

    def mask(self, guard: str, budget: float) -> np.ndarray:
        k = round(budget * self.n)
        if guard == "oracle":
            return oracle_mask(self.closed, self.rag, k)
        return retrieve_mask(self.scores[guard], k)

    def final(self, mask: np.ndarray) -> np.ndarray:
        """Whether each final answer is right: the retrieval answer where ``mask``, else the closed-book one."""
        return np.where(mask, self.rag, self.closed)

    def accuracy(self, mask: np.ndarray) -> float:
        return float(self.final(mask).mean()) if self.n else math.nan

    def random_accuracy(self, budget: float) -> float:
        """Expected accuracy when ``round(b n)`` questions are retrieved uniformly at random."""
        k = round(budget * self.n)
        gain = float((self.rag.astype(float) - self.closed.astype(float)).mean())
        return float(self.closed.mean()) + k / self.n * gain if self.n else math.nan

    def point(self, guard: str, budget: float, idx: np.ndarray | None = None, level: float = 0.95) -> BudgetPoint:
        if guard == "random":
            return BudgetPoint("random", budget, round(budget * self.n), self.random_accuracy(budget))
        mask = self.mask(guard, budget)
        final = self.final(mask)
        low = high = math.nan
        if idx is not None and idx.size:
            ci = percentile_interval(float(final.mean()), final[idx].mean(axis=1), idx.shape[0], level)
            low, high = ci.low, ci.high
        thr = threshold_for(self.scores[guard], mask) if guard in self.scores else math.nan
        return BudgetPoint(
            guard,
            budget,
            int(mask.sum()),
            float(final.mean()),
            low,
            high,
            helped=int((mask & ~self.closed & self.rag).sum()),
            hurt=int((mask & self.closed & ~self.rag).sum()),
            threshold=thr,
        )

    def curve(self, guard: str, budgets: np.ndarray = CURVE_BUDGETS) -> np.ndarray:
        if guard == "random":
            return np.array([self.random_accuracy(b) for b in budgets])
        return np.array([self.accuracy(self.mask(guard, b)) for b in budgets])

    def paired(self, a: str, b: str, budget: float, idx: np.ndarray, level: float = 0.95) -> PairedDifference:
        """Accuracy of ``a`` minus ``b`` at ``budget`` on the resamples ``idx``: interval and two-sided p."""
        d = self.final(self.mask(a, budget)).astype(float) - self.final(self.mask(b, budget)).astype(float)
        return paired_difference(float(d.mean()), d[idx].mean(axis=1), idx.shape[0], level)


# -- live check ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveCheck:
    """The real :class:`~logtoku_guard.guard.Guard` against the replay on the first questions."""

    guard: str
    stat: str
    threshold: float
    n: int
    retrieved_live: int
    retrieved_replay: int
    same_decision: int
    same_answer: int
    accuracy_live: float
    accuracy_replay: float
    max_score_diff: float
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return _json_fields(self)


def live_check(
    backend: Any,
    items: Sequence[QAItem],
    setup: RagSetup,
    replay: Replay,
    closed: Sequence[CachedGeneration],
    rag: Sequence[CachedGeneration],
    *,
    guard: str = "logtoku",
    budget: float = 0.3,
    spec: GreedySpec | None = None,
    on_progress: ProgressFn | None = None,
) -> LiveCheck:
    """Run :class:`Guard` with "retrieve when <stat> < t" on ``items`` (the first questions of the replay).

    ``t`` is the replay's threshold at ``budget`` over all its questions. The backend must
    score as the replay's signal does (K = 2, clamped, for ``logtoku``).
    """
    import time

    from logtoku_guard.guard import Guard
    from logtoku_guard.policy import Policy

    if guard not in SIGNALS:
        msg = f"unknown guard signal {guard!r}; choose one of {sorted(SIGNALS)}"
        raise ConfigurationError(msg)
    n = len(items)
    if n > replay.n or [it.id for it in items] != list(replay.ids[:n]):
        msg = "the live check runs on the first questions of the replay, in order"
        raise ConfigurationError(msg)
    stat = SIGNALS[guard][1]
    if guard == "logtoku" and (getattr(backend, "k", 2), getattr(backend, "evidence", "clamped")) != (2, "clamped"):
        msg = (
            f"the live check of the LogTokU guard replays the K=2 clamped score, but the backend has "
            f"k={getattr(backend, 'k', None)!r}, evidence={getattr(backend, 'evidence', None)!r}; load it with k=2, clamped"
        )
        raise ConfigurationError(msg)
    mask = replay.mask(guard, budget)
    threshold = threshold_for(replay.scores[guard], mask)
    if not math.isfinite(threshold):
        msg = f"no threshold separates the {round(budget * replay.n)} least reliable answers (tied scores); try another budget"
        raise ConfigurationError(msg)
    policy = Policy.from_dict(
        {
            "name": f"e2e-{guard}",
            "version": "1",
            "rules": [
                {
                    "name": f"retrieve-{guard}",
                    "when": {"stat": stat, "op": "<", "value": threshold},
                    "action": "retrieve",
                    "reason": f"{stat} below the {budget:g} budget threshold",
                }
            ],
            "default_action": "pass",
            "retrieve": {**setup.settings.model_dump(), "max_attempts": 1, "fallback": "pass"},
        }
    )
    runner = Guard(backend, policy, retriever=setup.retriever, options=(spec or GreedySpec()).options())
    judge = MatchJudge()
    retrieved_live = same_decision = same_answer = correct = 0
    diffs: list[float] = []
    start = time.perf_counter()
    for i, item in enumerate(items):
        result = runner.run(setup.user_turn(item))
        did = len(result.attempts) > 1
        first = result.attempts[0].decision.stats.get(stat)
        cached = float(replay.scores[guard][i])
        if math.isfinite(first) and math.isfinite(cached):
            diffs.append(abs(first - cached))
        expected = (rag[i] if mask[i] else closed[i]).answer
        answer = result.answer.strip()
        retrieved_live += did
        same_decision += did == bool(mask[i])
        same_answer += answer == expected
        correct += judge.judge(item, answer).correct
        if on_progress is not None:
            on_progress(1)
    return LiveCheck(
        guard=guard,
        stat=stat,
        threshold=threshold,
        n=n,
        retrieved_live=retrieved_live,
        retrieved_replay=int(mask[:n].sum()),
        same_decision=same_decision,
        same_answer=same_answer,
        accuracy_live=correct / n if n else math.nan,
        accuracy_replay=float(replay.final(mask)[:n].mean()) if n else math.nan,
        max_score_diff=max(diffs) if diffs else math.nan,
        seconds=time.perf_counter() - start,
    )


# -- report --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GuardEvalReport:
    """Everything the end-to-end evaluation measured."""

    model: str
    setup: dict[str, Any]
    diagnostics: dict[str, Any]
    points: tuple[BudgetPoint, ...]
    areas: dict[str, float]
    paired: tuple[dict[str, Any], ...]
    live: LiveCheck | None = None
    plots: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "setup": self.setup,
            "diagnostics": self.diagnostics,
            "points": [p.to_json() for p in self.points],
            "area_under_accuracy_budget": self.areas,
            "paired": list(self.paired),
            "live_check": self.live.to_json() if self.live else None,
            "plots": list(self.plots),
        }

    def to_markdown(self) -> str:
        d, s = self.diagnostics, self.setup
        lines = [
            f"## Guard end to end: NQ-open, {d['n']} questions, knowledge base {s['knowledge_base']} ({self.model})",
            "",
            f"Closed-book accuracy {_pct(d['closed_accuracy'])}; with retrieval for every question "
            f"{_pct(d['rag_accuracy'])} (covered questions {_pct(d['rag_accuracy_covered'])}, uncovered "
            f"{_pct(d['rag_accuracy_uncovered'])}). The gold answer is in the retrieved context for "
            f"{_pct(d['answer_in_context_covered'])} of covered and {_pct(d['answer_in_context_uncovered'])} "
            f"of uncovered questions. Retrieval helps {d['helps']} questions and hurts {d['hurts']}.",
            "",
            "| guard | budget | retrievals | accuracy % [95% CI] | helped | hurt |",
            "|---|---|---|---|---|---|",
        ]
        for p in self.points:
            ci = f" [{100 * p.low:.1f}, {100 * p.high:.1f}]" if math.isfinite(p.low) else ""
            lines.append(
                f"| {p.guard} | {p.budget:g} | {p.retrievals} | {100 * p.accuracy:.2f}{ci} | "
                f"{p.helped if p.guard != 'random' else '-'} | {p.hurt if p.guard != 'random' else '-'} |"
            )
        lines += [
            "",
            "Area under the accuracy-budget curve (mean accuracy over budgets 0..1, step 0.02; higher is better):",
            "",
            "| guard | area % |",
            "|---|---|",
            *[f"| {g} | {100 * a:.2f} |" for g, a in self.areas.items()],
        ]
        if self.paired:
            lines += [
                "",
                "Paired bootstrap of accuracy, LogTokU guard minus the other guard at the same budget:",
                "",
                "| budget | vs | difference (pts) [95% CI] | p |",
                "|---|---|---|---|",
                *[
                    f"| {r['budget']:g} | {r['vs']} | {100 * r['diff']:+.2f} [{100 * r['low']:+.2f}, {100 * r['high']:+.2f}] "
                    f"| {r['p']:.3f} |"
                    for r in self.paired
                ],
            ]
        if self.live is not None:
            v = self.live
            lines += [
                "",
                f"Live check: the real `Guard` (rule `{v.stat} < {v.threshold:.5g}`, one retrieval, then pass) on the "
                f"first {v.n} questions: same retrieve decision as the replay for {v.same_decision}/{v.n}, same final "
                f"answer for {v.same_answer}/{v.n}; retrievals {v.retrieved_live} live vs {v.retrieved_replay} replayed; "
                f"accuracy {_pct(v.accuracy_live)} live vs {_pct(v.accuracy_replay)} replayed; largest difference of the "
                f"signal between the live guard and the cache re-score {v.max_score_diff:.2e}; {v.seconds:.0f} s.",
            ]
        lines += ["", *[f"- {note}" for note in self.setup.get("notes", ())]]
        lines += [f"\n![{p}]({p})" for p in self.plots]
        return "\n".join(lines) + "\n"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "n/a"


def evaluate_guard(
    items: Sequence[QAItem],
    closed: Sequence[CachedGeneration],
    rag: Sequence[CachedGeneration],
    setup: RagSetup,
    *,
    model: str,
    budgets: Sequence[float] = DEFAULT_BUDGETS,
    n_boot: int = 1000,
    seed: int = 0,
    top_n: int = DEFAULT_TOP_N,
) -> tuple[GuardEvalReport, Replay]:
    """Label both answer sets, replay every guard at every budget, with bootstrap intervals."""
    if [g.id for g in closed] != [it.id for it in items] or [g.id for g in rag] != [it.id for it in items]:
        msg = "closed-book and retrieval answers must cover the evaluated questions, in order"
        raise ConfigurationError(msg)
    for b in budgets:
        if not 0.0 <= b <= 1.0:
            msg = f"retrieval budgets are shares of the questions in [0, 1], got {b!r}"
            raise ConfigurationError(msg)
    judge = MatchJudge()
    closed_ok = np.array([v.correct for v in judge.judge_many(items, [g.answer for g in closed])], dtype=bool)
    rag_ok = np.array([v.correct for v in judge.judge_many(items, [g.answer for g in rag])], dtype=bool)
    scored = single_pass_scores(closed, top_n)
    replay = Replay(tuple(it.id for it in items), closed_ok, rag_ok, {g: scored[m] for g, (m, _) in SIGNALS.items()})
    n = replay.n
    idx = bootstrap_indices(n, n_boot, seed) if n_boot else np.zeros((0, n), dtype=int)
    guards = [*SIGNALS, "random", "oracle"]
    points: list[BudgetPoint] = []
    for b in sorted(set(budgets)):
        if b in (0.0, 1.0):  # every guard is the same there
            name = "never retrieve" if b == 0.0 else "always retrieve"
            points.append(replace(replay.point("logtoku", b, idx), guard=name, threshold=math.nan))
        else:
            points.extend(replay.point(g, b, idx) for g in guards)
    areas = {g: float(replay.curve(g).mean()) for g in guards}
    paired = tuple(
        {"budget": b, "vs": other, **_paired_row(replay.paired("logtoku", other, b, idx))}
        for b in budgets
        if 0.0 < b < 1.0 and n_boot
        for other in ("entropy", "probability")
    )
    covered = np.array([it.id in setup.kb.covered for it in items], dtype=bool)
    # the nq-match judge applied to the retrieved context: a gold answer in it as whole words
    in_context = np.array([judge.judge(it, " ".join(setup.passages(it))).correct for it in items], dtype=bool)
    diagnostics = {
        "n": n,
        "closed_accuracy": float(closed_ok.mean()),
        "rag_accuracy": float(rag_ok.mean()),
        "rag_accuracy_covered": _mean(rag_ok[covered]),
        "rag_accuracy_uncovered": _mean(rag_ok[~covered]),
        "answer_in_context_covered": _mean(in_context[covered]),
        "answer_in_context_uncovered": _mean(in_context[~covered]),
        "helps": int((~closed_ok & rag_ok).sum()),
        "hurts": int((closed_ok & ~rag_ok).sum()),
        "nan_scores": {g: int((~np.isfinite(s)).sum()) for g, s in replay.scores.items()},
    }
    settings = {
        "knowledge_base": setup.kb.name,
        "coverage": setup.kb.coverage,
        "passages_in_base": len(setup.kb.passages),
        "covered_questions": int(covered.sum()),
        "retrieved_per_question": setup.settings.passages,
        "retrieval": "BM25 (KeywordRetriever) queried with the user turn",
        "prompt": setup.template,
        "retrieval_prompt": setup.prompt_template,
        "judge": judge.name,
        "signals": {g: m for g, (m, _) in SIGNALS.items()},
        "n_boot": n_boot,
        "seed": seed,
        "notes": (
            "Budgets are matched in sample: at budget b every signal retrieves for its round(b n) least reliable "
            "closed-book answers; a deployed guard sets the threshold from its calibration profile instead.",
            "random = expected accuracy of retrieving the same number of questions uniformly at random; "
            "oracle = retrieves where retrieval helps first (an upper bound, not a method).",
            "helped = wrong closed-book answer made right by retrieval; hurt = right answer made wrong.",
        ),
    }
    return GuardEvalReport(model, settings, diagnostics, tuple(points), areas, paired), replay


def _paired_row(d: PairedDifference) -> dict[str, float]:
    return {"diff": d.diff, "low": d.low, "high": d.high, "p": d.p_value}


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else math.nan


def write_report(
    report: GuardEvalReport, replay: Replay, out_dir: str | Path, *, plots: bool = True
) -> tuple[GuardEvalReport, list[Path]]:
    """Markdown, JSON and (with ``plots``) the accuracy-budget PNG under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    if plots:
        from logtoku_guard.evaluation.plots import plot_budget_curves

        curves = {g: (CURVE_BUDGETS, replay.curve(g)) for g in [*SIGNALS, "random", "oracle"]}
        png = plot_budget_curves(
            out / "guard-e2e-budget.png", curves, f"Guard end to end, NQ-open, {report.setup['knowledge_base']}"
        )
        files.append(png)
        report = replace(report, plots=(png.name,))
    md, js = out / "guard-e2e.md", out / "guard-e2e.json"
    md.write_text(report.to_markdown(), encoding="utf-8")
    js.write_text(json.dumps(report.to_json(), ensure_ascii=False, indent=1, allow_nan=False), encoding="utf-8")
    return report, [md, js, *files]


# -- the whole run -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GuardEvalConfig:
    """Settings of :func:`run_guard_eval` (``live = 0``: no live check)."""

    cache_dir: Path
    out_dir: Path | None = None
    coverage: float = 0.7
    kb_seed: int = 0
    settings: RetrieveSettings = field(default_factory=RetrieveSettings)
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    greedy: GreedySpec = field(default_factory=GreedySpec)
    batch_size: int = 8
    n_boot: int = 1000
    seed: int = 0
    live: int = 100
    live_guard: str = "logtoku"
    live_budget: float = 0.3
    plots: bool = True

    def __post_init__(self) -> None:
        if self.live < 0:
            msg = f"live must be >= 0 (questions for the live Guard check; 0 = none), got {self.live!r}"
            raise ConfigurationError(msg)
        if self.live_guard not in SIGNALS:
            msg = f"unknown live guard signal {self.live_guard!r}; choose one of {sorted(SIGNALS)}"
            raise ConfigurationError(msg)
        if not 0.0 < self.live_budget < 1.0:
            msg = f"live_budget must be strictly between 0 and 1, got {self.live_budget!r}"
            raise ConfigurationError(msg)


@dataclass(frozen=True)
class GuardEvalRun:
    report: GuardEvalReport
    replay: Replay
    files: tuple[Path, ...]


def run_guard_eval(
    items: Sequence[QAItem],
    pool: Sequence[QAItem],
    model: str,
    backend: Any,
    config: GuardEvalConfig,
    *,
    live_backend: Any = None,
    on_progress: Callable[[str, int, int], ProgressFn] | None = None,
) -> GuardEvalRun:
    """Closed-book answers (the ``eval nq-open`` cache), retrieval answers, replay, live check, report.

    ``backend`` (or a zero-argument callable returning one) generates what the caches miss,
    with K = 5 stored logits; ``live_backend`` (same kind) runs the live check and must score
    like the live signal (K = 2 for ``logtoku``). Either is loaded only when needed.
    """
    from logtoku_guard.evaluation.qa import QAConfig, _resolve, collect

    kb = build_knowledge_base(items, pool, config.coverage, config.kb_seed)
    setup = RagSetup(kb, config.settings)
    qa_config = QAConfig(
        dataset="nq-open", cache_dir=config.cache_dir, samples_limit=0, greedy=config.greedy, batch_size=config.batch_size
    )
    holder: list[Any] = []
    closed, _ = collect(items, model, lambda: _resolve(backend, holder), qa_config, on_progress)
    cache = rag_cache(config.cache_dir, model, setup, config.greedy)
    todo = [it for it in items if it.id not in cache]
    if todo:
        progress = on_progress("retrieval", len(items), len(items) - len(todo)) if on_progress else None
        run_rag(
            _resolve(backend, holder), todo, setup, cache, spec=config.greedy, batch_size=config.batch_size, on_progress=progress
        )
    rag = cache.records([it.id for it in items])
    report, replay = evaluate_guard(
        items, closed, rag, setup, model=model, budgets=config.budgets, n_boot=config.n_boot, seed=config.seed
    )
    if config.live:
        live_items = list(items[: config.live])
        progress = on_progress("live guard", len(live_items), 0) if on_progress else None
        runner = _resolve(live_backend, []) if live_backend is not None else _resolve(backend, holder)
        check = live_check(
            runner,
            live_items,
            setup,
            replay,
            closed,
            rag,
            guard=config.live_guard,
            budget=config.live_budget,
            spec=config.greedy,
            on_progress=progress,
        )
        report = replace(report, live=check)
    files: list[Path] = []
    if config.out_dir is not None:
        report, files = write_report(report, replay, config.out_dir, plots=config.plots)
    return GuardEvalRun(report, replay, tuple(files))
