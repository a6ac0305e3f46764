"""``logtoku-guard eval ordinary``: the shipped guard, as it is, on ordinary questions.

Issue 41: the guard flags most inventions but passes most of the model's confident wrong
answers to ordinary questions. This measures that on the ordinary-questions benchmark
(:mod:`~logtoku_eval.ordinary`: plain facts in three wordings, split by question), beside the
real questions of the traffic benchmark's test half (:mod:`~logtoku_eval.traffic`):

* answers are made as ``logtoku-guard ask`` makes them (:data:`~logtoku_eval.generate.SERVING`:
  the question alone as the user turn, greedy, 64 tokens, no stop string), or with
  ``--temperature``/``--max-new-tokens``/``--sample-seed`` as another decoding makes them
  (:class:`~logtoku_eval.generate.SampledSpec`: ``--temperature 1 --max-new-tokens 256`` is what
  ``serve`` does with a request that leaves both out);
* each answer is judged correct or wrong by ``nq-match`` against its accepted answers
  (:func:`~logtoku_guard.calibration.self_labels.answer_matches`, the judge of ``eval traffic``
  and ``calibrate``);
* the guard decides each answer through :class:`~logtoku_guard.decision.decider.Decider`, as the
  guard does in ``ask``: a profile (default: the one shipped for the model, with its fitted guard)
  and a policy (default: :func:`~logtoku_guard.decision.policy.default_policy`), **nothing refit**;
  an answer is *flagged* when the action is not ``pass``.

The report has one row per wording and one over all of them: answers correct and wrong, the share
of wrong answers flagged and of correct answers passed, and the ``guard_score`` AUROC correct vs
wrong, each with a 95% bootstrap interval that resamples **questions** (a question's three
wordings move together). Every answer is kept (:class:`ScoredAnswer`: ids, wording, answer text,
correct, ``guard_score``, action and the first-pass statistics) in ``ordinary-answers.jsonl``, for
statistics computed later on the same answers (second looks, other policies).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_eval.cache import CachedGeneration
from logtoku_eval.fabricated_eval import generation_from_cached
from logtoku_eval.jsonout import dumps, finite_json, write_json
from logtoku_eval.ordinary import WORDINGS, OrdinaryItem
from logtoku_guard.calibration.profiles import ModelProfile
from logtoku_guard.calibration.self_labels import answer_matches
from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.policy import Policy
from logtoku_guard.scoring.guard_score import auroc

__all__ = [
    "ALL",
    "DEFAULT_DECODING",
    "OrdinaryReport",
    "RateCI",
    "Row",
    "ScoredAnswer",
    "evaluate_ordinary",
    "policy_threshold",
    "read_answers",
    "score_answers",
    "summarise",
    "write_ordinary",
]

ALL = "all"
"""The label of the row pooling the three wordings."""
TRAFFIC = "traffic"
"""The benchmark name of the traffic benchmark's real questions in :class:`ScoredAnswer` records."""


@dataclass(frozen=True)
class ScoredAnswer:
    """One answer, its judgment and the guard's first-pass decision on it.

    ``benchmark``: ``"ordinary"`` or ``"traffic"``; ``group``: the wording (``sentence``,
    ``lower``, ``paraphrase``) of an ordinary question, the style (``cased``, ``lower``) of a
    traffic one; ``question_id`` groups a question's wordings. ``flagged`` is ``action != "pass"``.
    ``stats``: every first-pass statistic (``ResponseStats.as_dict``; None where undefined).
    """

    benchmark: str
    id: str
    question_id: str
    category: str
    split: str
    group: str
    question: str
    references: tuple[str, ...]
    answer: str
    correct: bool
    guard_score: float
    action: str
    rule: str | None
    reason: str
    stats: dict[str, float | None]
    threshold: float | None = None
    """The threshold of the policy's ``guard_score`` comparison on this answer (None when none was made)."""

    @property
    def flagged(self) -> bool:
        return self.action != "pass"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = finite_json(
            {
                "benchmark": self.benchmark,
                "id": self.id,
                "question_id": self.question_id,
                "category": self.category,
                "split": self.split,
                "group": self.group,
                "question": self.question,
                "references": list(self.references),
                "answer": self.answer,
                "correct": self.correct,
                "guard_score": self.guard_score,
                "action": self.action,
                "flagged": self.flagged,
                "rule": self.rule,
                "reason": self.reason,
                "stats": self.stats,
                "threshold": self.threshold,
            }
        )
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ScoredAnswer:
        g = obj["guard_score"]
        return cls(
            benchmark=obj["benchmark"],
            id=obj["id"],
            question_id=obj["question_id"],
            category=obj["category"],
            split=obj["split"],
            group=obj["group"],
            question=obj["question"],
            references=tuple(obj["references"]),
            answer=obj["answer"],
            correct=bool(obj["correct"]),
            guard_score=math.nan if g is None else float(g),
            action=obj["action"],
            rule=obj["rule"],
            reason=obj["reason"],
            stats=dict(obj["stats"]),
            threshold=obj.get("threshold"),
        )


@dataclass(frozen=True)
class QuestionRef:
    """What :func:`score_answers` needs to know of a question, whichever benchmark it comes from."""

    benchmark: str
    id: str
    question_id: str
    category: str
    split: str
    group: str
    question: str
    references: tuple[str, ...]

    @classmethod
    def of_ordinary(cls, it: OrdinaryItem) -> QuestionRef:
        return cls("ordinary", it.id, it.question_id, it.category, it.split, it.wording, it.question, it.answers)


def score_answers(
    questions: Sequence[QuestionRef],
    records: Sequence[CachedGeneration],
    *,
    model: str,
    profile: ModelProfile,
    policy: Policy,
) -> list[ScoredAnswer]:
    """Judge each answer (``nq-match`` against the question's references) and let the guard
    decide on it (``Decider(policy, profile)``: the profile's guard, no refit)."""
    if len(questions) != len(records):
        msg = f"{len(questions)} questions but {len(records)} answers; pass one answer per question"
        raise ValueError(msg)
    decider = Decider(policy, profile)
    out = []
    for q, rec in zip(questions, records, strict=True):
        if rec.id != q.id:
            msg = f"the answer {rec.id!r} is paired with the question {q.id!r}; pass them in the same order"
            raise ValueError(msg)
        decision = decider.decide(generation_from_cached(rec, model))
        stats = decision.stats
        threshold = next((float(c.threshold) for c in decision.checks if c.stat == "guard_score"), None)
        out.append(
            ScoredAnswer(
                benchmark=q.benchmark,
                id=q.id,
                question_id=q.question_id,
                category=q.category,
                split=q.split,
                group=q.group,
                question=q.question,
                references=q.references,
                answer=rec.answer,
                correct=answer_matches(rec.answer, q.references)[0],
                guard_score=float(stats.guard_score),
                action=decision.action,
                rule=decision.rule,
                reason=decision.reason,
                stats=stats.as_dict(),
                threshold=threshold,
            )
        )
    return out


@dataclass(frozen=True)
class RateCI:
    """A share or an AUROC with its 95% bootstrap interval (NaN when undefined) and its sample size."""

    value: float
    low: float
    high: float
    n: int

    def cell(self) -> str:
        if not math.isfinite(self.value):
            return f"n/a (n={self.n})"
        ci = f" [{100 * self.low:.1f}, {100 * self.high:.1f}]" if math.isfinite(self.low) else ""
        return f"{100 * self.value:.1f}{ci}"

    def to_json(self) -> list[Any]:
        return finite_json([self.value, self.low, self.high, self.n])


@dataclass(frozen=True)
class Row:
    """One line of the table: answers of one wording (or all), correct/wrong, flagged/passed, AUROC."""

    label: str
    n: int
    n_correct: int
    n_wrong: int
    wrong_flagged: RateCI
    correct_passed: RateCI
    auroc: RateCI
    """``guard_score`` AUROC, correct (positive) vs wrong; NaN scores rank lowest."""

    @property
    def accuracy(self) -> float:
        return self.n_correct / self.n if self.n else math.nan

    def cells(self) -> str:
        acc = f"{100 * self.accuracy:.1f}%" if self.n else "n/a"
        return (
            f"| {self.label} | {self.n} | {self.n_correct} ({acc}) | {self.n_wrong} | {self.wrong_flagged.cell()} | "
            f"{self.correct_passed.cell()} | {self.auroc.cell()} |"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "n": self.n,
            "n_correct": self.n_correct,
            "n_wrong": self.n_wrong,
            "accuracy": finite_json(self.accuracy),
            "wrong_flagged": self.wrong_flagged.to_json(),
            "correct_passed": self.correct_passed.to_json(),
            "auroc": self.auroc.to_json(),
        }


def _cluster_boot(clusters: np.ndarray, n_boot: int, seed: int) -> list[np.ndarray]:
    """``n_boot`` resamples of the answer indices, drawing whole clusters (questions) with replacement."""
    labels, inverse = np.unique(clusters, return_inverse=True)
    members = [np.flatnonzero(inverse == k) for k in range(labels.size)]
    rng = np.random.default_rng(seed)
    return [np.concatenate([members[k] for k in rng.integers(0, labels.size, labels.size)]) for _ in range(n_boot)]


def _ci(point: float, values: list[float], n: int) -> RateCI:
    v = np.array([x for x in values if math.isfinite(x)])
    if not math.isfinite(point) or v.size == 0:
        return RateCI(point, math.nan, math.nan, n)
    return RateCI(point, float(np.quantile(v, 0.025)), float(np.quantile(v, 0.975)), n)


def summarise(label: str, answers: Sequence[ScoredAnswer], *, n_boot: int = 1000, seed: int = 0) -> Row:
    """The row of ``answers``: counts, wrong flagged, correct passed and AUROC, with 95% intervals
    from ``n_boot`` resamples of whole questions (``question_id``)."""
    correct = np.array([a.correct for a in answers], dtype=bool)
    flagged = np.array([a.flagged for a in answers], dtype=bool)
    scores = np.array([a.guard_score for a in answers], dtype=np.float64)
    clusters = np.array([f"{a.benchmark}/{a.question_id}" for a in answers])
    boots = _cluster_boot(clusters, n_boot, seed) if len(answers) else []

    def wrong_flagged(ix: np.ndarray) -> float:
        w = ~correct[ix]
        return float(flagged[ix][w].mean()) if w.any() else math.nan

    def correct_passed(ix: np.ndarray) -> float:
        c = correct[ix]
        return float((~flagged[ix][c]).mean()) if c.any() else math.nan

    def area(ix: np.ndarray) -> float:
        return auroc(scores[ix], correct[ix])

    everything = np.arange(len(answers))
    n_correct, n_wrong = int(correct.sum()), int((~correct).sum())
    return Row(
        label=label,
        n=len(answers),
        n_correct=n_correct,
        n_wrong=n_wrong,
        wrong_flagged=_ci(wrong_flagged(everything), [wrong_flagged(b) for b in boots], n_wrong),
        correct_passed=_ci(correct_passed(everything), [correct_passed(b) for b in boots], n_correct),
        auroc=_ci(area(everything), [area(b) for b in boots], len(answers)),
    )


DEFAULT_DECODING = "greedy, at most 64 tokens"
"""What ``eval ordinary`` decodes by default (as ``ask``)."""


@dataclass(frozen=True)
class OrdinaryReport:
    """What ``eval ordinary`` measured (see the module docstring)."""

    model: str
    profile: str
    """Where the profile (and its guard) came from."""
    policy: str
    threshold: float | None
    """The policy's ``guard_score`` threshold as resolved on this profile (None when it reads another statistic)."""
    split: str
    rows: list[Row]
    """One row per wording, then :data:`ALL`."""
    traffic: list[Row] = field(default_factory=list)
    """The traffic benchmark's real questions of the same half, per style and overall (empty when not measured)."""
    categories: list[Row] = field(default_factory=list)
    """One row per category, the three wordings pooled."""
    answers: list[ScoredAnswer] = field(default_factory=list)
    decoding: str = DEFAULT_DECODING
    """How the answers were decoded, in words (``eval ordinary --temperature``, ``--max-new-tokens``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "profile": self.profile,
            "policy": self.policy,
            "threshold": finite_json(self.threshold),
            "split": self.split,
            "decoding": self.decoding,
            "rows": [r.to_json() for r in self.rows],
            "traffic": [r.to_json() for r in self.traffic],
            "categories": [r.to_json() for r in self.categories],
        }

    def to_markdown(self) -> str:
        rule = f"flags when guard_score < {self.threshold:.4f}" if self.threshold is not None else "no guard_score threshold"
        head = [
            "| wording | answers | correct | wrong | wrong flagged % [95% CI] | correct passed % [95% CI] "
            "| AUROC % correct vs wrong [95% CI] |",
            "|---|---|---|---|---|---|---|",
        ]
        lines = [
            f"### Ordinary questions, {self.split} half ({self.model}; shipped guard and policy as they are, nothing refit)",
            "",
            f"Profile: {self.profile}. Policy: {self.policy} ({rule}). Answers: {self.decoding}. "
            "Intervals resample questions (a question's wordings together).",
            "",
            *head,
            *(r.cells() for r in self.rows),
        ]
        if self.traffic:
            lines += ["", f"The traffic benchmark's real questions, {self.split} half, the same guard and policy:", ""]
            lines += [head[0].replace("| wording |", "| style |"), head[1]]
            lines += [r.cells() for r in self.traffic]
        if self.categories:
            lines += ["", "Per category (the three wordings pooled):", ""]
            lines += [head[0].replace("| wording |", "| category |"), head[1]]
            lines += [r.cells() for r in self.categories]
        return "\n".join(lines)


def policy_threshold(policy: Policy, profile: ModelProfile) -> float | None:
    """The threshold of the policy's first comparison on ``guard_score``, resolved on ``profile`` as
    the guard resolves it (a quantile or a stated-risk target); None when no rule reads ``guard_score``."""
    from logtoku_guard.decision.conditions import comparisons, resolve_threshold

    for rule in policy.rules:
        for c in comparisons(rule.when):
            if c.stat == "guard_score":
                return resolve_threshold(c, profile)[0]
    return None


def evaluate_ordinary(
    answers: Sequence[ScoredAnswer],
    *,
    model: str,
    profile: str,
    policy: str,
    threshold: float | None,
    split: str,
    traffic: Sequence[ScoredAnswer] = (),
    n_boot: int = 1000,
    seed: int = 0,
    decoding: str = DEFAULT_DECODING,
) -> OrdinaryReport:
    """The table: per wording and over all wordings, per traffic style and over the traffic half, per category."""
    rows = [summarise(w, [a for a in answers if a.group == w], n_boot=n_boot, seed=seed) for w in WORDINGS]
    rows.append(summarise(ALL, answers, n_boot=n_boot, seed=seed))
    traffic_rows: list[Row] = []
    if traffic:
        styles = sorted({a.group for a in traffic})
        traffic_rows = [summarise(s, [a for a in traffic if a.group == s], n_boot=n_boot, seed=seed) for s in styles]
        traffic_rows.append(summarise(ALL, traffic, n_boot=n_boot, seed=seed))
    categories = [
        summarise(c, [a for a in answers if a.category == c], n_boot=n_boot, seed=seed)
        for c in sorted({a.category for a in answers})
    ]
    return OrdinaryReport(
        model=model,
        profile=profile,
        policy=policy,
        threshold=threshold,
        split=split,
        rows=rows,
        traffic=traffic_rows,
        categories=categories,
        answers=[*answers, *traffic],
        decoding=decoding,
    )


def write_ordinary(report: OrdinaryReport, out_dir: str | Path) -> list[Path]:
    """``ordinary.md``, ``ordinary.json`` (the table) and ``ordinary-answers.jsonl`` (every answer,
    :class:`ScoredAnswer`) under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js, ans = out / "ordinary.md", out / "ordinary.json", out / "ordinary-answers.jsonl"
    md.write_text(report.to_markdown() + "\n", encoding="utf-8")
    write_json(js, report.to_json())
    ans.write_text("".join(dumps(a.to_json(), indent=None) + "\n" for a in report.answers), encoding="utf-8")
    return [md, js, ans]


def read_answers(path: str | Path) -> list[ScoredAnswer]:
    """The answers :func:`write_ordinary` wrote to ``ordinary-answers.jsonl``."""
    p = Path(path)
    return [ScoredAnswer.from_json(json.loads(line)) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
