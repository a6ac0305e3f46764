"""Strict JSON for the harness's result files: an undefined number is ``null``, never ``NaN``.

A metric is undefined where its data cannot define it (an accuracy over no questions, an AUROC
with one class, a fold the guard could not be fit on). Python's ``json`` writes such a value as
``NaN``, which is not JSON (``jq``, browsers and most parsers refuse the file), and with
``allow_nan=False`` it raises instead. Every result file goes through :func:`write_json`:
non-finite floats (NaN, +-inf, numpy's included) become ``null``, numpy scalars and arrays
become plain numbers and lists, paths become strings, and the encoder still runs with
``allow_nan=False`` so nothing non-finite can slip through. The report that holds such a value
says why it is undefined (the guard report's ``diagnostics.undefined``, the notes of the others).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

import numpy as np

__all__ = ["dumps", "finite_json", "write_json"]


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float as ``None``, numpy values as Python ones, tuples
    and sets as lists and paths as strings; any other type is left for the encoder to refuse."""
    if isinstance(value, bool | None | str | int) and not isinstance(value, np.generic):
        return value
    if isinstance(value, float | np.floating):
        x = float(value)
        return x if math.isfinite(x) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Mapping):
        return {str(k) if isinstance(k, PurePath) else k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset | np.ndarray):
        return [finite_json(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    return value


def dumps(value: Any, *, indent: int | None = 1) -> str:
    """``value`` as strict JSON text (:func:`finite_json`, then ``allow_nan=False``)."""
    return json.dumps(finite_json(value), ensure_ascii=False, indent=indent, allow_nan=False)


def write_json(path: Path, value: Any) -> Path:
    """Write ``value`` to ``path`` as strict JSON (UTF-8); returns ``path``."""
    path.write_text(dumps(value), encoding="utf-8")
    return path
