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

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from logtoku_eval.datasets import QAItem
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.jsonl import json_lines

__all__ = ["GROUPS", "SPLITS", "TrafficItem", "dataset_name", "default_path", "load_traffic"]

Group = Literal["plausible", "real"]
Split = Literal["tune", "test"]

GROUPS = ("plausible", "real")
SPLITS = ("tune", "test", "all")
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
    from logtoku_guard.calibration.profiles import SHIPPED_DIR

    return SHIPPED_DIR / DATA_FILE


def dataset_name(path: str | os.PathLike[str] | None = None) -> str:
    """``"traffic-<first 8 hex of the file's SHA-256>"``: the name to give the generation caches.

    Plausible ids are positions (``plausible-000``), so a regenerated file reuses them for
    other questions; naming the cache after the content keeps stale answers out of it.
    """
    p = Path(path) if path is not None else default_path()
    return f"traffic-{hashlib.sha256(p.read_bytes()).hexdigest()[:8]}"


def _item(obj: object, where: str) -> TrafficItem:
    if not isinstance(obj, dict):
        msg = f"{where}: not a traffic record (a JSON object), got {type(obj).__name__}; {_FIX}"
        raise ConfigurationError(msg)
    missing = [k for k in (*_TEXT_FIELDS, *_LIST_FIELDS) if k not in obj]
    if missing:
        msg = f"{where}: the traffic record lacks {', '.join(map(repr, missing))}; {_FIX}"
        raise ConfigurationError(msg)
    for k in _TEXT_FIELDS:
        if not isinstance(obj[k], str) or not obj[k].strip():
            msg = f"{where}: {k!r} must be a non-empty text, got {obj[k]!r}; {_FIX}"
            raise ConfigurationError(msg)
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
    if split not in SPLITS:
        msg = f"split must be one of {SPLITS}, got {split!r}; report on 'test', tune on 'tune'"
        raise ConfigurationError(msg)
    p = Path(path) if path is not None else default_path()
    if not p.is_file():
        msg = f"the traffic benchmark file {str(p)!r} does not exist; pass an existing path"
        raise ConfigurationError(msg)
    items: list[TrafficItem] = []
    seen: dict[str, int] = {}
    try:
        with open(p, encoding="utf-8") as fh:
            for n, _line, obj in json_lines(p, fh, _FIX):
                item = _item(obj, f"{p}:{n}")
                if item.id in seen:
                    msg = f"{p}:{n}: the id {item.id!r} was already used on line {seen[item.id]}; {_FIX}"
                    raise ConfigurationError(msg)
                seen[item.id] = n
                items.append(item)
    except UnicodeDecodeError as exc:
        msg = f"the traffic benchmark file {str(p)!r} is not UTF-8 (byte {exc.start}); {_FIX}"
        raise ConfigurationError(msg) from exc
    return [it for it in items if split == "all" or it.split == split]
