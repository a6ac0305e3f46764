"""The question datasets calibration can read in place: TruthfulQA and NQ-open.

* TruthfulQA (Lin et al. 2022): ``truthfulqa/TruthfulQA.csv`` (starts with a BOM: ``utf-8-sig``).
* NQ-open (Kwiatkowski et al. 2019; Lee et al. 2019): ``nq_open/NQ-open.dev.jsonl``.

Calibration ships its own 200 questions (:mod:`~logtoku_guard.calibration.prompts`); these
loaders serve :func:`~logtoku_guard.calibration.default_calibration_prompts` with a
``data_dir`` (any number of questions, picked from the full files) and the evaluation harness
(``logtoku_eval``), which adds GoEmotions. Where the data folder is, first match wins
(:func:`data_root`):

1. an explicit argument: ``data_dir=`` (the CLI's ``--data-dir``), or a file ``path``;
2. the environment variable ``$LOGTOKU_GUARD_DATA`` (:data:`DATA_ENV`), used as given.

There is no guess beside the package or the working directory: an installed package has no
such folder, and a guess would make a checkout behave unlike a user's install. The folder's
layout and where to get each file are in the README ("Evaluation datasets").

A missing folder or file raises :class:`DatasetUnavailableError` naming the path and the
fix, so callers (and tests) can skip clearly; a malformed file (not UTF-8, a line that is not
JSON, a missing field or column) raises :class:`ConfigurationError` naming the file, the line
and the expected format.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

from logtoku_guard.errors import ConfigurationError, DatasetUnavailableError

TRUTHFULQA_FILE = Path("truthfulqa") / "TruthfulQA.csv"
NQ_OPEN_FILE = Path("nq_open") / "NQ-open.dev.jsonl"
DATA_ENV = "LOGTOKU_GUARD_DATA"
"""The environment variable naming the datasets folder."""


@dataclass(frozen=True)
class QAItem:
    """One question with its references.

    ``correct``: acceptable answers (TruthfulQA: best answer first, then the correct ones;
    NQ-open: the short gold answers). ``incorrect``: known wrong answers (TruthfulQA only).
    """

    id: str
    question: str
    correct: tuple[str, ...]
    incorrect: tuple[str, ...] = ()
    category: str = ""


def default_data_dir() -> Path | None:
    """The datasets folder when none is passed: ``$LOGTOKU_GUARD_DATA`` as given, else None."""
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else None


def existing_data_dir() -> Path | None:
    """:func:`default_data_dir` when that folder exists, else None (for callers that skip)."""
    root = default_data_dir()
    return root if root is not None and root.is_dir() else None


def data_root(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The datasets folder: ``data_dir`` if given, else :func:`default_data_dir`; it must exist."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    if root is None or not root.is_dir():
        where = f"{str(root)!r} is not a folder" if root else f"no data folder given and ${DATA_ENV} is not set"
        msg = (
            f"the evaluation datasets folder was not found ({where}); pass the folder (CLI: eval --data-dir; "
            f"Python: data_dir=) or set ${DATA_ENV} to a "
            "folder holding truthfulqa/TruthfulQA.csv, nq_open/NQ-open.dev.jsonl and goemotions/ (README: Evaluation datasets)"
        )
        raise DatasetUnavailableError(msg)
    return root


def dataset_file(path: str | os.PathLike[str] | None, data_dir: str | os.PathLike[str] | None, default: Path) -> Path:
    p = Path(path) if path is not None else data_root(data_dir) / default
    if not p.is_file():
        msg = (
            f"dataset file {str(p)!r} does not exist; set ${DATA_ENV}, pass the datasets folder "
            "(CLI: eval --data-dir; Python: data_dir=), or give the file path (CLI: --path; Python: path=)"
        )
        raise DatasetUnavailableError(msg)
    return p


def bad_file_error(p: Path, where: str, what: str, exc: BaseException | None, expected: str) -> ConfigurationError:
    detail = f" ({exc.__class__.__name__}: {exc})" if exc is not None else ""
    return ConfigurationError(f"{p}{where}: {what}{detail}; {expected}")


def not_utf8_error(p: Path, exc: UnicodeDecodeError) -> ConfigurationError:
    return ConfigurationError(
        f"dataset file {str(p)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at byte {exc.start}); "
        "save it as UTF-8 or point to the original file"
    )


def _split_answers(field: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in field.split(";") if a.strip())


def check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        msg = f"limit must be a positive integer or None (all), got {limit!r}"
        raise ConfigurationError(msg)


def load_truthfulqa(
    path: str | os.PathLike[str] | None = None, *, data_dir: str | os.PathLike[str] | None = None, limit: int | None = None
) -> list[QAItem]:
    """The 817 TruthfulQA generation questions, in file order (``limit``: the first N).

    Ids are ``tqa-<row>`` (0-based). ``correct`` = best answer + correct answers (deduplicated,
    order kept), as in the paper's BLEURT protocol.
    """
    check_limit(limit)
    p = dataset_file(path, data_dir, TRUTHFULQA_FILE)
    items = []
    expected = "TruthfulQA.csv needs the columns 'Question', 'Best Answer', 'Correct Answers', 'Incorrect Answers'"
    try:
        with open(p, encoding="utf-8-sig", newline="") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                try:
                    correct = tuple(dict.fromkeys([row["Best Answer"].strip(), *_split_answers(row["Correct Answers"])]))
                    question, incorrect = row["Question"].strip(), _split_answers(row["Incorrect Answers"])
                except (KeyError, AttributeError) as exc:  # a missing column, or a short row (None)
                    raise bad_file_error(p, f", row {i + 1}", "missing or empty column", exc, expected) from exc
                items.append(
                    QAItem(
                        id=f"tqa-{i}",
                        question=question,
                        correct=tuple(c for c in correct if c),
                        incorrect=incorrect,
                        category=row.get("Category", "") or "",
                    )
                )
                if limit is not None and len(items) >= limit:
                    break
    except UnicodeDecodeError as exc:
        raise not_utf8_error(p, exc) from exc
    return items


def load_nq_open(
    path: str | os.PathLike[str] | None = None, *, data_dir: str | os.PathLike[str] | None = None, limit: int | None = None
) -> list[QAItem]:
    """NQ-open dev questions (3610) in file order; ids ``nq-<line>``; a ``?`` is appended."""
    check_limit(limit)
    p = dataset_file(path, data_dir, NQ_OPEN_FILE)
    items = []
    expected = "each line must be a UTF-8 JSON object with a 'question' (text) and an 'answer' (a list of texts)"
    with open(p, "rb") as fh:
        for i, raw in enumerate(fh):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise bad_file_error(p, f":{i + 1}", f"not UTF-8 text (byte {raw[exc.start]:#04x})", None, expected) from exc
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise bad_file_error(p, f":{i + 1}", "not JSON", exc, expected) from exc
            if not isinstance(obj, dict) or "question" not in obj or not isinstance(obj.get("answer"), list):
                raise bad_file_error(p, f":{i + 1}", f"got {line.strip()[:80]!r}", None, expected)
            q = str(obj["question"]).strip()
            answers = tuple(str(a) for a in obj["answer"])
            items.append(QAItem(id=f"nq-{i}", question=q if q.endswith("?") else q + "?", correct=answers))
            if limit is not None and len(items) >= limit:
                break
    return items
