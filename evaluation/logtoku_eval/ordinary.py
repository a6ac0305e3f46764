"""The ordinary-questions benchmark: plain factual questions a small chat model should mostly know.

Shipped with the core package (``logtoku_guard/calibration/data/ordinary.jsonl``) and made by
``benchmarks/ordinary/make_questions.py`` from the hand-written ``benchmarks/ordinary/questions.tsv``
(its README says how), written before any model answer was seen. Each question (capitals,
planets, authors, inventors, units, animals, dates, everyday science, ...) is asked in three
wordings (:data:`WORDINGS`): ``sentence`` (as written), ``lower`` (all lower case) and
``paraphrase`` (a hand-written rewording), with the same accepted answers.

The questions, not the wordings, are split half ``tune``, half ``test`` within each category:
tune on ``tune``, report on ``test`` only. Whether the model answers one correctly is judged
at eval time against ``answers`` (``eval ordinary``; :mod:`~logtoku_eval.ordinary_eval`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from logtoku_eval.datasets import QAItem
from logtoku_eval.question_files import SPLITS, check_split, content_name, read_items, record_fields, resolve, shipped_path
from logtoku_guard.errors import ConfigurationError

__all__ = ["SPLITS", "WORDINGS", "OrdinaryItem", "dataset_name", "default_path", "load_ordinary"]

Split = Literal["tune", "test"]
Wording = Literal["sentence", "lower", "paraphrase"]

WORDINGS: tuple[Wording, ...] = ("sentence", "lower", "paraphrase")
"""How each question is asked: as written (sentence case), all lower case, and a paraphrase."""
DATA_FILE = "ordinary.jsonl"
_FIX = "regenerate it with benchmarks/ordinary/make_questions.py"
_TEXT_FIELDS = ("id", "question_id", "category", "split", "wording", "question")


@dataclass(frozen=True)
class OrdinaryItem:
    """One question of the ordinary-questions benchmark in one wording.

    ``id``: ``<question_id>-<wording>`` (unique); ``question_id``: ``<category>-NNN``, shared by
    the three wordings of one question; ``split``: ``"tune"`` or ``"test"`` (the same for the
    three wordings); ``wording``: one of :data:`WORDINGS`; ``answers``: the accepted answers,
    canonical first.
    """

    id: str
    question_id: str
    category: str
    split: Split
    wording: Wording
    question: str
    answers: tuple[str, ...]

    def to_qa_item(self) -> QAItem:
        """As a :class:`QAItem` for the generation caches and judges (``category`` = ``"<category>/<wording>"``)."""
        return QAItem(id=self.id, question=self.question, correct=self.answers, category=f"{self.category}/{self.wording}")


def default_path() -> Path:
    """The shipped benchmark file inside the installed package."""
    return shipped_path(DATA_FILE)


def dataset_name(path: str | os.PathLike[str] | None = None) -> str:
    """``"ordinary-<first 8 hex of the file's SHA-256>"``: the name to give the generation caches.

    Question ids are positions within a category (``capital-001``), so a regenerated file can
    reuse one for another question; naming the cache after the content keeps stale answers out.
    """
    return content_name("ordinary", resolve(path, DATA_FILE))


def _item(raw: object, where: str) -> OrdinaryItem:
    record = "an ordinary-question record"
    obj = record_fields(raw, where, record=record, text_fields=_TEXT_FIELDS, other_fields=("answers",), fix=_FIX)
    answers = obj["answers"]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        msg = f"{where}: 'answers' must be a non-empty list of non-empty texts, got {answers!r}; {_FIX}"
        raise ConfigurationError(msg)
    split, wording = obj["split"], obj["wording"]
    if split not in ("tune", "test") or wording not in WORDINGS:
        msg = f"{where}: split must be 'tune' or 'test' and wording one of {WORDINGS}, got {split!r} and {wording!r}; {_FIX}"
        raise ConfigurationError(msg)
    if obj["id"] != f"{obj['question_id']}-{wording}":
        msg = f"{where}: the id {obj['id']!r} is not '<question_id>-<wording>' ({obj['question_id']!r}, {wording!r}); {_FIX}"
        raise ConfigurationError(msg)
    return OrdinaryItem(
        id=obj["id"],
        question_id=obj["question_id"],
        category=obj["category"],
        split=split,
        wording=wording,
        question=obj["question"],
        answers=tuple(answers),
    )


def _check_questions(items: list[OrdinaryItem], p: Path) -> None:
    """The wordings of one question share its category, half and answers (split by question, not wording)."""
    first: dict[str, OrdinaryItem] = {}
    for it in items:
        ref = first.setdefault(it.question_id, it)
        if (it.category, it.split, it.answers) != (ref.category, ref.split, ref.answers):
            msg = (
                f"{p}: the wordings {ref.id!r} and {it.id!r} of one question differ in category, split or answers "
                f"({ref.category!r}/{ref.split!r}/{list(ref.answers)!r} vs "
                f"{it.category!r}/{it.split!r}/{list(it.answers)!r}); {_FIX}"
            )
            raise ConfigurationError(msg)


def load_ordinary(
    path: str | os.PathLike[str] | None = None,
    *,
    split: str = "all",
    wordings: tuple[str, ...] | None = None,
    categories: tuple[str, ...] | None = None,
) -> list[OrdinaryItem]:
    """The benchmark's records of ``split`` (``"tune"``, ``"test"`` or ``"all"``), in file order
    (question by question, the three wordings of each together).

    ``wordings``: keep only these (default all of :data:`WORDINGS`); ``categories``: keep only
    these (default all). ``path``: another file in the same format (default: the shipped one).
    A bad line raises :class:`~logtoku_guard.errors.ConfigurationError` naming the file and line.
    """
    check_split(split)
    bad = [w for w in wordings or () if w not in WORDINGS]
    if bad:
        msg = f"wordings must be among {WORDINGS}, got {bad!r}"
        raise ConfigurationError(msg)
    p = resolve(path, DATA_FILE)
    items = read_items(p, "the ordinary-questions file", _FIX, _item)
    _check_questions(items, p)
    if categories is not None:
        unknown = sorted(set(categories) - {it.category for it in items})
        if unknown:
            msg = f"no ordinary question has the categories {unknown!r}; known: {sorted({it.category for it in items})}"
            raise ConfigurationError(msg)
    return [
        it
        for it in items
        if (split == "all" or it.split == split)
        and (wordings is None or it.wording in wordings)
        and (categories is None or it.category in categories)
    ]
