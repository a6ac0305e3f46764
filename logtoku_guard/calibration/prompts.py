"""Calibration prompts: the shipped default set (TruthfulQA + NQ-open questions) or the user's own file.

The default set ships inside the package (``calibration/data/calibration_questions.jsonl``,
with the datasets' licences beside it), so ``logtoku-guard calibrate`` and the first ``ask``
need nothing outside the installed package. It holds 200 questions, 100 spread evenly over
TruthfulQA's 817 and 100 over NQ-open's 3610 dev questions, each with its reference answers;
``scripts/make_calibration_set.py`` rebuilds it from the full datasets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from logtoku_guard.errors import ConfigurationError, DatasetUnavailableError
from logtoku_guard.jsonl import json_lines

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend
    from logtoku_guard.types import DecodingOptions, Generation

__all__ = [
    "CALIBRATION_QUESTIONS",
    "CalibrationQuestion",
    "answer_in_batches",
    "default_calibration_prompts",
    "pick_calibration_questions",
    "read_prompts_file",
    "shipped_calibration_questions",
]

CALIBRATION_QUESTIONS = Path(__file__).parent / "data" / "calibration_questions.jsonl"
"""The shipped default calibration set: one ``{"id", "source", "question", "answers"}`` per line."""

SOURCES = ("truthfulqa", "nq_open")


@dataclass(frozen=True)
class CalibrationQuestion:
    """One shipped calibration question: its dataset (``truthfulqa`` or ``nq_open``), its id
    there (``tqa-<row>``, ``nq-<line>``) and its reference answers."""

    id: str
    source: str
    question: str
    answers: tuple[str, ...]


def shipped_calibration_questions() -> list[CalibrationQuestion]:
    """The 200 shipped calibration questions, TruthfulQA's half first (file order)."""
    p = CALIBRATION_QUESTIONS
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        msg = f"the shipped calibration set {str(p)!r} cannot be read ({exc.strerror}); reinstall logtoku-guard"
        raise DatasetUnavailableError(msg) from exc
    out = []
    for i, line, obj in json_lines(p, lines, 'each line must be {"id", "source", "question", "answers"}'):
        ok = isinstance(obj, dict) and obj.get("source") in SOURCES and isinstance(obj.get("question"), str)
        if not ok or not isinstance(obj.get("answers"), list):
            msg = f"{p}:{i}: not a calibration question ({line[:80]!r}); reinstall logtoku-guard"
            raise ConfigurationError(msg)
        out.append(CalibrationQuestion(str(obj["id"]), obj["source"], obj["question"], tuple(map(str, obj["answers"]))))
    return out


def pick_calibration_questions(tqa: list[str], nq: list[str], n: int) -> list[str]:
    """``n`` questions, half from ``tqa`` and half from ``nq``: every m-th question, spread over
    each whole list rather than its first topic; a ``?`` is appended where missing."""
    half = n // 2
    picks = tqa[:: max(1, len(tqa) // max(half, 1))][:half] + nq[:: max(1, len(nq) // max(n - half, 1))][: n - half]
    return [q if q.endswith("?") else q + "?" for q in picks]


def default_calibration_prompts(n: int = 200, data_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """``n`` calibration questions, half from TruthfulQA and half from NQ-open (deterministic order).

    Without ``data_dir``: from the shipped set (at most its 200 questions; ``n = 200`` is the
    whole set, a smaller ``n`` spreads over each half). With ``data_dir`` (a folder laid out
    like the evaluation datasets, see :mod:`logtoku_guard.calibration.datasets`): picked the
    same way from the full files, for any ``n``.
    """
    if n < 1:
        msg = f"the number of calibration questions must be at least 1, got {n}"
        raise ConfigurationError(msg)
    if data_dir is not None:
        from logtoku_guard.calibration.datasets import load_nq_open, load_truthfulqa

        try:
            tqa = [item.question for item in load_truthfulqa(data_dir=data_dir)]
            nq = [item.question for item in load_nq_open(data_dir=data_dir)]
        except DatasetUnavailableError as exc:
            msg = f"the calibration datasets are unavailable: {exc}; or give your own prompts file"
            raise DatasetUnavailableError(msg) from exc
        return pick_calibration_questions(tqa, nq, n)
    shipped = shipped_calibration_questions()
    if n > len(shipped):
        msg = (
            f"the shipped calibration set has {len(shipped)} questions, fewer than the {n} asked for; "
            f"ask for at most {len(shipped)} or give your own prompts file (--prompts FILE)"
        )
        raise ConfigurationError(msg)
    if n == len(shipped):
        return [q.question for q in shipped]
    tqa = [q.question for q in shipped if q.source == "truthfulqa"]
    nq = [q.question for q in shipped if q.source == "nq_open"]
    return pick_calibration_questions(tqa, nq, n)


MAX_PROMPTS_BYTES = 100_000_000
"""Largest prompts file read (``calibrate --prompts``)."""


def read_prompts_file(path: str | os.PathLike[str]) -> list[str]:
    """One prompt per line (``.txt``) or a JSONL file with a ``question`` or ``prompt`` field.

    Raises :class:`ConfigurationError` naming the file (and the line or byte) when it is
    missing, a folder, unreadable, not UTF-8, or holds a line that is not a JSON object with
    one of those fields. Blank lines are skipped; line numbers count them.
    """
    from logtoku_guard.files import read_bounded_text

    p = Path(path)
    # a regular file only, read bounded: a FIFO or a device is refused before anything is read
    text = read_bounded_text(p, MAX_PROMPTS_BYTES, "prompts file")
    if p.suffix != ".jsonl":
        return [line for line in text.splitlines() if line.strip()]
    out = []
    for i, line, obj in json_lines(p, text.splitlines(), "each JSONL line must be one JSON object"):
        if not isinstance(obj, dict) or not ({"question", "prompt"} & set(obj)):
            msg = f"{p}:{i}: each JSONL line needs a 'question' or 'prompt' field, got {line[:80]!r}"
            raise ConfigurationError(msg)
        out.append(str(obj.get("question", obj.get("prompt"))))
    return out


def answer_in_batches(
    backend: Backend,
    prompts: Sequence[str],
    options: DecodingOptions,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
) -> list[Generation]:
    """``backend``'s answers to ``prompts``, ``batch_size`` per ``batch`` call, in order; ``on_batch(n)``
    after each batch with the number of prompts it held (a progress bar). Every calibration and
    guard fit answers its questions this way."""
    out: list[Generation] = []
    for i in range(0, len(prompts), batch_size):
        chunk = list(prompts[i : i + batch_size])
        out.extend(backend.batch(chunk, options))
        if on_batch is not None:
            on_batch(len(chunk))
    return out
