"""A guard for any model, with no labels from the user: shipped questions whose answers judge themselves.

``logtoku-guard calibrate --fit-guard`` answers the *tune* half of the realistic-traffic
questions that ship in ``data/`` with the model being calibrated, labels each answer without a
person, and fits the guard on those labels (:func:`fit_self_labelled`):

* **real** questions (famous facts and NQ-open dev questions) carry reference answers; an answer
  is right when a reference appears in it (:func:`answer_matches`, the SQuAD/NQ normalisation:
  lower case, no punctuation or articles, a reference as whole words);
* **plausible** and **syllable** questions ask about invented people, institutes, treaties,
  books... (named with ordinary words, or with syllable soup): no right answer exists, so every
  answer to them is wrong by construction, whatever the model says.

Each answer falls in one group, ``real-correct``, ``real-wrong``, ``plausible`` or ``syllable``;
the guard is fit cross-fitted (5 folds) and keeps each group's out-of-fold scores and labels
(:attr:`~logtoku_guard.scoring.guard_score.GuardModel.reference_scores`), from which a risk-stated
threshold (:mod:`~logtoku_guard.scoring.risk`) and each group's expected flag rate follow.
The shipped guard of the embedded model was fit this way (by ``logtoku-guard eval traffic``,
which also reports the held-out *test* half). Licences: ``NOTICE-traffic`` beside the files.

**Enough labels** (:func:`fit_with_enough_labels`): a stated-risk threshold needs enough *correct*
answers for its bound to be useful (:func:`~logtoku_guard.calibration.thresholds.labels_needed`); a
model that gets few of the traffic questions right is then asked more shipped questions with
references, the tune half of the ordinary-questions benchmark (``data/ordinary.jsonl``; one wording
of every question before the next wording, categories in turn: :func:`ordinary_questions`), until it
has them or they run out, and says which.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.types import DecodingOptions

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend
    from logtoku_guard.scoring.guard_score import GuardModel, StatsLike

__all__ = [
    "GROUPS",
    "LabelledQuestion",
    "SelfLabelledFit",
    "answer_matches",
    "fit_on_outcomes",
    "fit_self_labelled",
    "fit_with_enough_labels",
    "labelled_questions",
    "normalize_answer",
    "ordinary_questions",
    "outcome_of",
]

DATA = Path(__file__).parent / "data"
TRAFFIC_FILE = DATA / "traffic.jsonl"
FABRICATED_FILE = DATA / "fabricated.jsonl"
ORDINARY_FILE = DATA / "ordinary.jsonl"
GROUPS = ("real-correct", "real-wrong", "plausible", "syllable")
"""The outcome groups of a self-labelled answer; only ``real-correct`` is right."""
SPLITS = ("tune", "test", "all")
_FIX = "reinstall logtoku-guard (the shipped question files are damaged)"

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD/NQ normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_matches(answer: str, references: Sequence[str]) -> tuple[bool, bool]:
    """``(matches, exact)``: whether a normalised reference equals the normalised answer (``exact``)
    or appears in it as whole words (NQ-open's ``nq-match``)."""
    a = normalize_answer(answer)
    if not a:
        return False, False
    golds = [g for g in (normalize_answer(r) for r in references) if g]
    exact = any(a == g for g in golds)
    return exact or any(f" {g} " in f" {a} " for g in golds), exact


@dataclass(frozen=True)
class LabelledQuestion:
    """One shipped question: ``group`` ``real`` (``answers``: its references), ``plausible`` or
    ``syllable`` (invented: no answer), its ``category`` and half (``split``: tune or test)."""

    id: str
    group: str
    category: str
    split: str
    question: str
    answers: tuple[str, ...]


def labelled_questions(
    split: str = "tune", *, traffic: Path | None = None, fabricated: Path | None = None
) -> list[LabelledQuestion]:
    """The realistic-traffic questions of ``split`` (``tune``, ``test`` or ``all``) plus the
    syllable-name fabrications, in file order (other files of the same formats may be given)."""
    if split not in SPLITS:
        msg = f"split must be one of {SPLITS}, got {split!r}; fit on 'tune', report on 'test'"
        raise ConfigurationError(msg)
    out = []
    for where, obj in _records(traffic or TRAFFIC_FILE):
        group = obj.get("group")
        if group not in ("real", "plausible") or (group == "real") != bool(obj.get("answers")):
            msg = f"{where}: a traffic question is 'real' with answers or 'plausible' without, got {group!r}; {_FIX}"
            raise ConfigurationError(msg)
        out.append(_question(obj, str(group), where))
    for where, obj in _records(fabricated or FABRICATED_FILE):
        if obj.get("kind") == "fabricated":  # its known facts are the traffic file's category 'known'
            out.append(_question(obj, "syllable", where))
    return [q for q in out if split in ("all", q.split)]


def ordinary_questions(split: str = "tune", *, path: Path | None = None) -> list[LabelledQuestion]:
    """The ordinary-questions benchmark's ``split`` as ``real`` questions with references, ordered so
    that any prefix is balanced: every question in its ``sentence`` wording first (categories in
    turn), then ``lower``, then ``paraphrase`` (a question's wordings are not independent labels)."""
    if split not in SPLITS:
        msg = f"split must be one of {SPLITS}, got {split!r}; fit on 'tune', report on 'test'"
        raise ConfigurationError(msg)
    by_wording: dict[str, dict[str, list[LabelledQuestion]]] = {}
    for where, obj in _records(path or ORDINARY_FILE):
        wording = obj.get("wording")
        if wording not in ("sentence", "lower", "paraphrase") or not obj.get("answers"):
            msg = f"{where}: an ordinary question needs a wording (sentence, lower, paraphrase) and answers, got {wording!r}"
            msg += f"; {_FIX}"
            raise ConfigurationError(msg)
        q = _question(obj, "real", where)
        if split in ("all", q.split):
            by_wording.setdefault(str(wording), {}).setdefault(q.category, []).append(q)
    out: list[LabelledQuestion] = []
    for wording in ("sentence", "lower", "paraphrase"):
        cats = by_wording.get(wording, {})
        for i in range(max((len(v) for v in cats.values()), default=0)):
            out.extend(cats[c][i] for c in sorted(cats) if i < len(cats[c]))
    return out


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    from logtoku_guard.files import read_bounded_text
    from logtoku_guard.jsonl import json_lines

    out = []
    for i, _, obj in json_lines(path, read_bounded_text(path, 10_000_000, "a shipped question file").splitlines(), _FIX):
        if not isinstance(obj, dict):
            msg = f"{path}:{i}: not a JSON object; {_FIX}"
            raise ConfigurationError(msg)
        out.append((f"{path}:{i}", obj))
    return out


def _question(obj: dict[str, Any], group: str, where: str) -> LabelledQuestion:
    texts = [obj.get(k) for k in ("id", "category", "split", "question")]
    answers = obj.get("answers", [])
    if not all(isinstance(t, str) and t.strip() for t in texts) or not isinstance(answers, list):
        msg = f"{where}: needs id, category, split and question texts and a list of answers; {_FIX}"
        raise ConfigurationError(msg)
    if obj["split"] not in ("tune", "test") or not all(isinstance(a, str) for a in answers):
        msg = f"{where}: split must be 'tune' or 'test' and answers texts, got {obj['split']!r}; {_FIX}"
        raise ConfigurationError(msg)
    return LabelledQuestion(obj["id"], group, obj["category"], obj["split"], obj["question"], tuple(answers))


def outcome_of(question: LabelledQuestion, answer: str) -> str:
    """The answer's group: ``real-correct`` / ``real-wrong`` for a real question, else its group (wrong by construction)."""
    if question.group != "real":
        return question.group
    return "real-correct" if answer_matches(answer, question.answers)[0] else "real-wrong"


def fit_self_labelled(
    backend: Backend,
    options: DecodingOptions | None = None,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
    questions: Sequence[LabelledQuestion] | None = None,
    seed: int = 0,
) -> tuple[GuardModel, dict[str, int]]:
    """Answer ``questions`` (default: the shipped tune half) with ``backend``, label each answer by
    its group and fit the guard; returns the guard and how many answers fell in each group
    (:func:`fit_with_enough_labels` asking for no more)."""
    fit = fit_with_enough_labels(backend, 0, options, batch_size, on_batch, questions, more=(), seed=seed)
    return fit.guard, fit.counts


def fit_on_outcomes(
    rows: Sequence[StatsLike],
    groups: Sequence[str],
    *,
    source: str,
    features: Sequence[str] | None = None,
    l2: float = 1.0,
    folds: int = 5,
    seed: int = 0,
    balance_groups: bool = False,
    max_tokens: int | None = None,
) -> GuardModel:
    """The guard fit on answers labelled by their group (``real-correct`` right, every other wrong),
    cross-fitted, each group's out-of-fold scores kept: the one fit of ``calibrate --fit-guard`` and
    of the harness's ``eval traffic`` (which fit the shipped guard)."""
    from logtoku_guard.scoring.guard_score import FEATURES, fit_guard

    labels = [g == "real-correct" for g in groups]
    return fit_guard(
        rows,
        labels,
        [source],
        features=features or FEATURES,
        l2=l2,
        folds=folds,
        seed=seed,
        groups=list(groups),
        balance_groups=balance_groups,
        max_tokens=max_tokens,
    )


@dataclass(frozen=True)
class SelfLabelledFit:
    """A self-labelled guard and where its labels came from: ``counts`` per group of every answer,
    ``needed`` correct answers for a useful bound (0: not asked), ``more`` shipped questions answered
    beyond the first set (``more_correct`` of them right), ``met``: whether ``needed`` was reached."""

    guard: GuardModel
    counts: dict[str, int]
    needed: int
    more: int
    more_correct: int
    met: bool


def fit_with_enough_labels(
    backend: Backend,
    needed: int,
    options: DecodingOptions | None = None,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
    questions: Sequence[LabelledQuestion] | None = None,
    more: Sequence[LabelledQuestion] | None = None,
    seed: int = 0,
) -> SelfLabelledFit:
    """Answer ``questions`` (default: the shipped traffic tune half), then, while fewer than ``needed``
    answers are right, the next ``batch_size`` of ``more`` (default: :func:`ordinary_questions` of the tune
    half) until ``needed`` is reached or ``more`` runs out; fit the guard on every answer."""
    from logtoku_guard.calibration.prompts import answer_in_batches
    from logtoku_guard.scoring.stats import ResponseStats

    if needed < 0:
        msg = f"needed must be a number of correct answers >= 0, got {needed!r}"
        raise ConfigurationError(msg)
    qs = list(questions) if questions is not None else labelled_questions("tune")
    pool = list(more) if more is not None else ordinary_questions("tune")
    opts = options or DecodingOptions(max_new_tokens=64)
    answers = answer_in_batches(backend, [q.question for q in qs], opts, batch_size, on_batch)
    groups = [outcome_of(q, g.text) for q, g in zip(qs, answers, strict=True)]
    first = len(qs)
    while groups.count("real-correct") < needed and pool:
        chunk, pool = pool[:batch_size], pool[batch_size:]
        made = answer_in_batches(backend, [q.question for q in chunk], opts, batch_size, on_batch)
        qs += chunk
        answers += made
        groups += [outcome_of(q, g.text) for q, g in zip(chunk, made, strict=True)]
    rows = [ResponseStats.from_generation(g) for g in answers]
    counts = {g: groups.count(g) for g in GROUPS}
    source = "traffic-tune" if questions is None else "self-labelled questions"
    if len(qs) > first:
        source += f" + {len(qs) - first} ordinary-tune" if more is None else f" + {len(qs) - first} more"
    guard = fit_on_outcomes(rows, groups, source=source, seed=seed, max_tokens=opts.max_new_tokens)
    more_correct = groups[first:].count("real-correct")
    return SelfLabelledFit(guard, counts, needed, len(qs) - first, more_correct, counts["real-correct"] >= needed)
