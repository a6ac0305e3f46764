"""The known-vs-fabricated benchmark: questions the embedded model knows vs questions about invented things.

Shipped with the core package (``logtoku_guard/calibration/data/fabricated.jsonl``) and made by
``benchmarks/fabricated/make_questions.py`` (its README says how): half **known** questions
(famous facts the embedded SmolLM2-135M-Instruct answered correctly, as judged by the
``nq-match`` judge, every candidate's outcome recorded in
``benchmarks/fabricated/known_filter.jsonl``), half **fabricated** ones (invented people,
institutes, books, places, chemicals and laws, from templates and random syllables, seeded).
Each half is split into ``tune`` and ``test``, stratified by kind and category: tune
thresholds and fit combinations on ``tune``, report on ``test`` only.

The label of the benchmark is the kind: a reliable guard passes ``known`` questions and flags
``fabricated`` ones (:attr:`FabricatedItem.is_known` is the positive class, in the same
direction as reliability: higher = more reliable).
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

Kind = Literal["known", "fabricated"]
Split = Literal["tune", "test"]

SPLITS = ("tune", "test", "all")
KINDS = ("known", "fabricated")
DATA_FILE = "fabricated.jsonl"


@dataclass(frozen=True)
class FabricatedItem:
    """One question of the known-vs-fabricated benchmark.

    ``kind``: ``"known"`` (a fact the model answers correctly) or ``"fabricated"`` (about an
    invented entity; no answer exists). ``category``: the kind of entity (``book``,
    ``chemical``, ``institute``, ``law``, ``person``, ``place``). ``answers``: accepted answers
    with their aliases, first the canonical one (known items only; empty for fabricated ones).
    ``template``: the question template's id. ``invented``: the invented words in the
    question (fabricated items only). ``split``: ``"tune"`` or ``"test"``.
    """

    id: str
    question: str
    kind: Kind
    category: str
    answers: tuple[str, ...]
    template: str
    split: Split
    invented: tuple[str, ...] = ()

    @property
    def is_known(self) -> bool:
        """The benchmark's positive class: the model knows the answer (a guard should pass it)."""
        return self.kind == "known"

    def to_qa_item(self) -> QAItem:
        """As a :class:`QAItem` for the generation caches and judges (``category`` = ``"kind/category"``)."""
        return QAItem(id=self.id, question=self.question, correct=self.answers, category=f"{self.kind}/{self.category}")


def default_path() -> Path:
    """The shipped benchmark file inside the installed package."""
    from logtoku_guard.calibration.profiles import SHIPPED_DIR

    return SHIPPED_DIR / DATA_FILE


def dataset_name(path: str | os.PathLike[str] | None = None) -> str:
    """``"fabricated-<first 8 hex of the file's SHA-256>"``: the name to give the generation caches.

    Item ids are positions (``known-000``, ``fab-000``), so a regenerated file reuses them for
    other questions; naming the cache after the content keeps stale answers out of it.
    """
    p = Path(path) if path is not None else default_path()
    return f"fabricated-{hashlib.sha256(p.read_bytes()).hexdigest()[:8]}"


def _item(obj: dict[str, object], where: str) -> FabricatedItem:
    try:
        item = FabricatedItem(
            id=str(obj["id"]),
            question=str(obj["question"]),
            kind=obj["kind"],  # type: ignore[arg-type]
            category=str(obj["category"]),
            answers=tuple(str(a) for a in obj["answers"]),  # type: ignore[attr-defined]
            template=str(obj["template"]),
            split=obj["split"],  # type: ignore[arg-type]
            invented=tuple(str(w) for w in obj.get("invented", ())),  # type: ignore[attr-defined]
        )
    except (KeyError, TypeError) as exc:
        msg = f"{where}: not a known-vs-fabricated record ({exc!r}); regenerate it with benchmarks/fabricated/make_questions.py"
        raise ConfigurationError(msg) from exc
    if item.kind not in KINDS or item.split not in ("tune", "test"):
        msg = f"{where}: kind must be one of {KINDS} and split 'tune' or 'test', got {item.kind!r} and {item.split!r}"
        raise ConfigurationError(msg)
    return item


def load_fabricated(split: str = "all", path: str | os.PathLike[str] | None = None) -> list[FabricatedItem]:
    """The known-vs-fabricated questions of ``split`` (``"tune"``, ``"test"`` or ``"all"``), in file order.

    ``path``: another file in the same format (default: the one shipped with the package).
    File order is all known items, then all fabricated ones.
    """
    if split not in SPLITS:
        msg = f"split must be one of {SPLITS}, got {split!r}; report on 'test', tune on 'tune'"
        raise ConfigurationError(msg)
    p = Path(path) if path is not None else default_path()
    if not p.is_file():
        msg = f"the known-vs-fabricated benchmark file {str(p)!r} does not exist; pass an existing path"
        raise ConfigurationError(msg)
    items = []
    fix = "regenerate it with benchmarks/fabricated/make_questions.py"
    try:
        with open(p, encoding="utf-8") as fh:
            for n, line, obj in json_lines(p, fh, fix):
                if not isinstance(obj, dict):
                    msg = f"{p}:{n}: not a known-vs-fabricated record (a JSON object), got {line.strip()[:80]!r}; {fix}"
                    raise ConfigurationError(msg)
                items.append(_item(obj, f"{p.name}:{n}"))
    except UnicodeDecodeError as exc:
        msg = f"the known-vs-fabricated benchmark file {str(p)!r} is not UTF-8 (byte {exc.start}); {fix}"
        raise ConfigurationError(msg) from exc
    return [it for it in items if split == "all" or it.split == split]
