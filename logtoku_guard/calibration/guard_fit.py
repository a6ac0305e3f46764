"""Fitting the guard score for a profile: on the user's labelled questions, or the shipped fit.

* :func:`read_labels`: a JSONL file, one ``{"question": ..., "correct": true|false}`` per line
  (``logtoku-guard calibrate --labels FILE``); ``correct`` says whether the model's answer to
  that question is right (or the question is about something it knows).
* :func:`fit_on_labels`: answers every labelled question with the backend (greedy, as the guard
  would), computes its :class:`~logtoku_guard.scoring.stats.ResponseStats` and fits
  :func:`~logtoku_guard.scoring.guard_score.fit_guard` (5-fold CV AUROC kept in the model).
* :func:`shipped_guard`: the guard fitted by the project on its own labelled data (the tune half
  of the known-vs-fabricated benchmark; see RESULTS.md), shipped in ``calibration/data/`` for
  the embedded model at K = 2, clamped evidence; None for any other setup.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.jsonl import json_lines
from logtoku_guard.scoring.guard_score import GuardModel, fit_guard
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.types import DecodingOptions

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend

__all__ = ["fit_on_labels", "read_labels", "shipped_guard", "shipped_guard_path"]

DATA_DIR = Path(__file__).parent / "data"
MAX_LABELS_BYTES = 100_000_000
"""Largest labels file read (about a million labelled questions)."""


def read_labels(path: str | os.PathLike[str]) -> list[tuple[str, bool]]:
    """``(question, correct)`` pairs from a JSONL file; a malformed line raises, naming it."""
    from logtoku_guard.files import read_bounded_text

    p = Path(path)
    lines = read_bounded_text(p, MAX_LABELS_BYTES, "the labels file").splitlines()
    out: list[tuple[str, bool]] = []
    for i, line, obj in json_lines(p, lines, 'each line must be {"question": ..., "correct": true|false}'):
        q, c = (obj.get("question"), obj.get("correct")) if isinstance(obj, dict) else (None, None)
        if not isinstance(q, str) or not q.strip() or not isinstance(c, bool):
            msg = f"{p}:{i}: needs a non-empty string 'question' and a boolean 'correct', got {line[:120]!r}"
            raise ConfigurationError(msg)
        out.append((q, c))
    if not out:
        msg = f"the labels file {str(p)!r} has no labelled question"
        raise ConfigurationError(msg)
    return out


def fit_on_labels(
    backend: Backend,
    labelled: Sequence[tuple[str, bool]],
    options: DecodingOptions | None = None,
    batch_size: int = 8,
    source: str = "user labels",
    on_batch: Callable[[int], None] | None = None,
    seed: int = 0,
) -> GuardModel:
    """Answer each labelled question with ``backend`` and fit the guard score on the labels."""
    from logtoku_guard.calibration.prompts import answer_in_batches

    opts = options or DecodingOptions(max_new_tokens=64)
    answers = answer_in_batches(backend, [q for q, _ in labelled], opts, batch_size, on_batch)
    rows = [ResponseStats.from_generation(g) for g in answers]
    return fit_guard(rows, [c for _, c in labelled], [source], seed=seed)


def shipped_guard_path(model: str, k: int = 2, evidence: str = "clamped") -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_")
    return DATA_DIR / f"guard-{safe}-k{k}-{evidence}.json"


def shipped_guard(model: str, k: int = 2, evidence: str = "clamped") -> GuardModel | None:
    """The project's fitted guard for this model and setup, or None when none is shipped."""
    path = shipped_guard_path(model, k, evidence)
    if not path.exists():
        return None
    return GuardModel.model_validate_json(path.read_text(encoding="utf-8"))
