"""The traffic-like benchmark: plausible fabrications beside real questions of graded difficulty.

Shipped with the core package (``logtoku_guard/calibration/data/traffic.jsonl``: ``calibrate
--fit-guard`` fits a guard on its tune half) and made by
``benchmarks/traffic/make_questions.py`` (its README says how), written before any model
answer was seen:

* group ``plausible``: questions about invented people, institutes, treaties, prizes, books,
  places, drugs and companies named with ordinary words ("Who founded the Cedarholt
  Foundation for Energy Policy?"); no answer exists, so a reliable guard flags them;
* group ``real``: questions with reference answers: every candidate of the known-facts pool
  (category ``known``, easy) and 200 NQ-open dev questions (category ``nq``, harder). Whether
  the model answers one correctly is judged at eval time against ``answers``.

Each (group, category) stratum is split half ``tune``, half ``test``: tune on ``tune``,
report on ``test`` only. The syllable-soup fabrications live in ``fabricated.jsonl``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from logtoku_eval.datasets import QAItem
from logtoku_eval.question_files import SPLITS, check_split, content_name, read_items, record_fields, resolve, shipped_path
from logtoku_guard.errors import ConfigurationError

__all__ = ["GROUPS", "SPLITS", "TrafficItem", "dataset_name", "default_path", "load_traffic"]

Group = Literal["plausible", "real"]
Split = Literal["tune", "test"]

GROUPS = ("plausible", "real")
DATA_FILE = "traffic.jsonl"
_FIX = "regenerate it with benchmarks/traffic/make_questions.py"
_TEXT_FIELDS = ("id", "group", "category", "split", "question", "source")
_LIST_FIELDS = ("answers", "invented")


@dataclass(frozen=True)
class TrafficItem:
    """One question of the traffic-like benchmark.

    ``group``: ``"plausible"`` (about an invented thing; ``answers`` empty, ``invented`` holds
    the invented names) or ``"real"`` (``answers``: the accepted answers, canonical first;
    ``invented`` empty). ``category``: ``person``, ``institute``, ``treaty``, ``prize``,
    ``book``, ``place``, ``drug``, ``company`` (plausible) or ``known``, ``nq`` (real).
    ``source``: ``"invented"``, ``"known_facts"`` or ``"nq_open"``. ``split``: ``"tune"`` or ``"test"``.
    """

    id: str
    group: Group
    category: str
    split: Split
    question: str
    answers: tuple[str, ...]
    source: str
    invented: tuple[str, ...] = ()

    @property
    def is_plausible_fabrication(self) -> bool:
        """The question is about an invented thing (a reliable guard flags its answer)."""
        return self.group == "plausible"

    def to_qa_item(self) -> QAItem:
        """As a :class:`QAItem` for the generation caches and judges (``category`` = ``"group/category"``)."""
        return QAItem(id=self.id, question=self.question, correct=self.answers, category=f"{self.group}/{self.category}")


def default_path() -> Path:
    """The shipped benchmark file inside the installed package."""
    return shipped_path(DATA_FILE)


def dataset_name(path: str | os.PathLike[str] | None = None) -> str:
    """``"traffic-<first 8 hex of the file's SHA-256>"``: the name to give the generation caches.

    Plausible ids are positions (``plausible-000``), so a regenerated file reuses them for
    other questions; naming the cache after the content keeps stale answers out of it.
    """
    return content_name("traffic", resolve(path, DATA_FILE))


def _item(raw: object, where: str) -> TrafficItem:
    obj = record_fields(raw, where, record="a traffic record", text_fields=_TEXT_FIELDS, other_fields=_LIST_FIELDS, fix=_FIX)
    for k in _LIST_FIELDS:
        value = obj[k]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            msg = f"{where}: {k!r} must be a list of non-empty texts, got {value!r}; {_FIX}"
            raise ConfigurationError(msg)
    group, split, answers, invented = obj["group"], obj["split"], obj["answers"], obj["invented"]
    if group not in GROUPS or split not in ("tune", "test"):
        msg = f"{where}: group must be one of {GROUPS} and split 'tune' or 'test', got {group!r} and {split!r}; {_FIX}"
        raise ConfigurationError(msg)
    well_formed = (not answers and bool(invented)) if group == "plausible" else (bool(answers) and not invented)
    if not well_formed:
        want = "no answers and its invented names" if group == "plausible" else "reference answers and no invented names"
        msg = f"{where}: a {group} question has {want}, got answers {answers!r} and invented {invented!r}; {_FIX}"
        raise ConfigurationError(msg)
    return TrafficItem(
        id=obj["id"],
        group=obj["group"],
        category=obj["category"],
        split=obj["split"],
        question=obj["question"],
        answers=tuple(obj["answers"]),
        source=obj["source"],
        invented=tuple(obj["invented"]),
    )


def load_traffic(path: str | os.PathLike[str] | None = None, *, split: str = "all") -> list[TrafficItem]:
    """The traffic-like benchmark's questions of ``split`` (``"tune"``, ``"test"`` or ``"all"``), in file order.

    ``path``: another file in the same format (default: the one shipped with the package).
    File order is the plausible questions, then the known facts, then the NQ-open ones. A bad
    line raises :class:`~logtoku_guard.errors.ConfigurationError` naming the file and line.
    """
    check_split(split)
    items = read_items(resolve(path, DATA_FILE), "the traffic benchmark file", _FIX, _item)
    return [it for it in items if split == "all" or it.split == split]
