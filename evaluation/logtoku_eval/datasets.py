"""Evaluation dataset loaders, read in place from a datasets folder the user points to.

* TruthfulQA and NQ-open: the core's loaders (:mod:`logtoku_guard.calibration.datasets`,
  which calibration also reads), re-exported here so the harness has one datasets module.
* GoEmotions (Demszky et al. 2020): ``goemotions/{dev,test}.tsv`` and ``emotions.txt``.

The folder is found as the core's loaders find it (:func:`data_root`): ``data_dir=`` (the
CLI's ``--data-dir``) or ``$LOGTOKU_GUARD_DATA``, never a guess. A missing folder or file
raises :class:`DatasetUnavailableError` naming the path and the fix; a malformed file raises
:class:`ConfigurationError` naming the file, the line and the expected format.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from logtoku_guard.calibration.datasets import (
    DATA_ENV,
    NQ_OPEN_FILE,
    TRUTHFULQA_FILE,
    QAItem,
    bad_file_error,
    check_limit,
    data_root,
    dataset_file,
    default_data_dir,
    existing_data_dir,
    load_nq_open,
    load_truthfulqa,
    not_utf8_error,
)
from logtoku_guard.errors import ConfigurationError, DatasetUnavailableError

__all__ = [
    "DATA_ENV",
    "GOEMOTIONS_DIR",
    "NQ_OPEN_FILE",
    "TRUTHFULQA_FILE",
    "DatasetUnavailableError",
    "EmotionItem",
    "QAItem",
    "data_root",
    "default_data_dir",
    "existing_data_dir",
    "load_emotion_names",
    "load_goemotions",
    "load_nq_open",
    "load_truthfulqa",
]

GOEMOTIONS_DIR = Path("goemotions")


@dataclass(frozen=True)
class EmotionItem:
    """One GoEmotions comment and its gold label ids (0..27; 27 = neutral)."""

    id: str
    text: str
    labels: tuple[int, ...]


def load_emotion_names(data_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The 28 GoEmotions label names in id order (27 = neutral)."""
    p = dataset_file(None, data_dir, GOEMOTIONS_DIR / "emotions.txt")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8_error(p, exc) from exc
    return [line.strip() for line in text.splitlines() if line.strip()]


def load_goemotions(split: str, *, data_dir: str | os.PathLike[str] | None = None, limit: int | None = None) -> list[EmotionItem]:
    """GoEmotions ``dev`` or ``test`` (``text<TAB>ids<TAB>comment id``), in file order."""
    if split not in ("dev", "test", "train"):
        msg = f"GoEmotions split must be 'dev' or 'test', got {split!r}"
        raise ConfigurationError(msg)
    check_limit(limit)
    p = dataset_file(None, data_dir, GOEMOTIONS_DIR / f"{split}.tsv")
    items = []
    try:
        with open(p, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 2:
                    continue
                try:
                    labels = tuple(int(x) for x in parts[1].split(",") if x.strip())
                except ValueError as exc:
                    expected = "each line must be <text> TAB <comma-separated label ids> [TAB <comment id>]"
                    raise bad_file_error(p, f":{i + 1}", "label ids are not integers", exc, expected) from exc
                items.append(
                    EmotionItem(id=parts[2] if len(parts) > 2 and parts[2] else f"{split}-{i}", text=parts[0], labels=labels)
                )
                if limit is not None and len(items) >= limit:
                    break
    except UnicodeDecodeError as exc:
        raise not_utf8_error(p, exc) from exc
    return items
