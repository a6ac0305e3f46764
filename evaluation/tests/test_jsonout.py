"""The harness's result files are strict JSON: an undefined number is null, never NaN."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from logtoku_eval.jsonout import dumps, finite_json, write_json

HARNESS = Path(__file__).resolve().parents[2] / "evaluation" / "logtoku_eval"


def strict_load(text: str) -> Any:
    """``json.loads`` that refuses NaN and Infinity (as jq, browsers and most parsers do)."""

    def refuse(constant: str) -> Any:
        pytest.fail(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_become_null_at_any_depth() -> None:
    value = {
        "a": math.nan,
        "b": [1.0, math.inf, -math.inf, np.float32("nan"), np.float64(0.5)],
        "c": ({"d": np.nan}, np.int64(3), np.bool_(True)),
        "e": np.array([1.0, np.nan]),
        "f": Path("x/y.png"),
        "g": "NaN",
    }
    assert finite_json(value) == {
        "a": None,
        "b": [1.0, None, None, None, 0.5],
        "c": [{"d": None}, 3, True],
        "e": [1.0, None],
        "f": "x/y.png",
        "g": "NaN",
    }
    assert strict_load(dumps(value))["b"] == [1.0, None, None, None, 0.5]
    assert type(finite_json(np.int64(3))) is int and type(finite_json(np.float32(0.25))) is float


def test_an_unknown_type_is_refused_not_written_as_text(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="object"):
        write_json(tmp_path / "x.json", {"x": object()})


def test_every_result_file_of_the_harness_goes_through_write_json() -> None:
    """No other ``json.dump``/``dumps`` in the harness, but the generation cache's (whose records
    are data read back, refused with allow_nan=False rather than changed)."""
    loose = []
    for path in HARNESS.rglob("*.py"):
        if path.name == "jsonout.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("dump", "dumps"):
                strict = any(k.arg == "allow_nan" and getattr(k.value, "value", True) is False for k in node.keywords)
                if path.name != "cache.py" or not strict:
                    loose.append(f"{path.relative_to(HARNESS)}:{node.lineno}")
    assert not loose, f"write result files with logtoku_eval.jsonout.write_json: {loose}"


def test_the_traffic_report_writes_an_undefined_number_as_null(tmp_path: Path) -> None:
    from logtoku_eval.traffic_eval import evaluate_traffic, judge_answers, write_traffic

    from .test_traffic_eval import record, synthetic

    answers = judge_answers(synthetic(30))
    calibration = [record(f"c{i}", f"Calibration question {i}?", f"The answer is Value{i} Now", 1.0 + i / 5) for i in range(20)]
    report = evaluate_traffic(answers, calibration, model="m", n_boot=20)
    report = dataclasses.replace(report, quantile=math.nan)
    write_traffic(report, tmp_path, plots=False)
    assert strict_load((tmp_path / "traffic.json").read_text(encoding="utf-8"))["quantile"] is None
    md = report.to_markdown()
    assert "nan" not in md.lower() and "quantile n/a" in md


def test_the_traffic_markdown_says_why_there_is_no_flag_rule() -> None:
    from logtoku_eval.traffic_eval import Rate, evaluate_traffic, judge_answers

    from .test_traffic_eval import record, synthetic

    answers = judge_answers(synthetic(30))
    calibration = [record(f"c{i}", f"Calibration question {i}?", f"The answer is Value{i} Now", 1.0 + i / 5) for i in range(20)]
    report = evaluate_traffic(answers, calibration, model="m", n_boot=20)
    empty = Rate(math.nan, math.nan, math.nan, 0)
    report = dataclasses.replace(
        report, threshold=math.nan, quantile=math.nan, test_rates={**report.test_rates, "plausible": empty}
    )
    md = report.to_markdown()
    assert "nan" not in md.lower()
    assert "Flag rule: n/a (no correct real answer of the tune half has a finite guard score" in md
    assert "| plausible | flag |" in md and "n/a (n=0)" in md
