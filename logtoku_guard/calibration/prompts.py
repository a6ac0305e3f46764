"""Calibration prompts: the default set (TruthfulQA + NQ-open questions) or the user's own file.

The datasets are read by :mod:`logtoku_guard.evaluation.datasets` (which also says where the
data folder is: an argument, ``$LOGTOKU_GUARD_DATA``, or a documented source-checkout
fallback); this module only picks the questions.
"""

from __future__ import annotations

import os
from pathlib import Path

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.evaluation.datasets import DatasetUnavailableError, load_nq_open, load_truthfulqa
from logtoku_guard.jsonl import json_lines

__all__ = ["default_calibration_prompts", "read_prompts_file"]


def default_calibration_prompts(n: int = 200, data_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """``n`` questions, half from TruthfulQA and half from NQ-open (deterministic order).

    ``data_dir``: the datasets folder (default: ``$LOGTOKU_GUARD_DATA``, then the documented
    source-checkout fallback; see :func:`~logtoku_guard.evaluation.datasets.data_root`).
    """
    try:
        tqa = [item.question for item in load_truthfulqa(data_dir=data_dir)]
        nq = [item.question for item in load_nq_open(data_dir=data_dir)]
    except DatasetUnavailableError as exc:
        msg = f"the default calibration set (TruthfulQA + NQ-open) is unavailable: {exc}; or give your own prompts file"
        raise DatasetUnavailableError(msg) from exc
    # Every m-th question: spread over the whole file rather than its first topic.
    half = n // 2
    picks = tqa[:: max(1, len(tqa) // max(half, 1))][:half] + nq[:: max(1, len(nq) // max(n - half, 1))][: n - half]
    return [q if q.endswith("?") else q + "?" for q in picks]


def read_prompts_file(path: str | os.PathLike[str]) -> list[str]:
    """One prompt per line (``.txt``) or a JSONL file with a ``question`` or ``prompt`` field.

    Raises :class:`ConfigurationError` naming the file (and the line or byte) when it is
    missing, a folder, unreadable, not UTF-8, or holds a line that is not a JSON object with
    one of those fields. Blank lines are skipped; line numbers count them.
    """
    p = Path(path)
    if not p.is_file():
        what = "is a folder" if p.is_dir() else "does not exist"
        msg = f"prompts file {str(p)!r} {what}; give a .txt (one prompt per line) or .jsonl file"
        raise ConfigurationError(msg)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        msg = (
            f"prompts file {str(p)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at byte {exc.start}); save it as UTF-8"
        )
        raise ConfigurationError(msg) from exc
    except OSError as exc:
        msg = f"prompts file {str(p)!r} cannot be read ({exc.strerror}); check its permissions"
        raise ConfigurationError(msg) from exc
    if p.suffix != ".jsonl":
        return [line for line in text.splitlines() if line.strip()]
    out = []
    for i, line, obj in json_lines(p, text.splitlines(), "each JSONL line must be one JSON object"):
        if not isinstance(obj, dict) or not ({"question", "prompt"} & set(obj)):
            msg = f"{p}:{i}: each JSONL line needs a 'question' or 'prompt' field, got {line[:80]!r}"
            raise ConfigurationError(msg)
        out.append(str(obj.get("question", obj.get("prompt"))))
    return out
