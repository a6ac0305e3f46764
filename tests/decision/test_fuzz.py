"""Property-based fuzzing: policy loading never raises anything but a policy error, and the
guard's decision never raises and never passes an undefined answer silently."""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logtoku_guard import ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import build_profile
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.stats import STAT_NAMES, ResponseStats
from logtoku_guard.types import ResponseScore
from logtoku_guard.wire.payloads import decision_payload

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = st.sampled_from(
    [
        "name",
        "version",
        "rules",
        "when",
        "stat",
        "op",
        "value",
        "quantile",
        "action",
        "all",
        "any",
        "not",
        "reason",
        "early_stop",
        "default_action",
        "retrieve",
        "max_attempts",
        "timeout_s",
        "context_template",
        "human_review",
        "message",
        "undefined",
        "first_tokens",
        "quadrants",
        "passages",
        "fallback",
    ]
) | st.text(max_size=8)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from([">", "<", ">=", "<=", "reliability", "max_eu", "n_tokens", "warn", "retrieve", "{review_id}", "{x"])
)
DATA = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5), max_leaves=30)

VALID = {
    "name": "p",
    "rules": [
        {"name": "a", "when": {"stat": "reliability", "op": "<", "value": {"quantile": 0.1}}, "action": "retrieve"},
        {
            "name": "b",
            "when": {"all": [{"stat": "max_eu", "op": ">", "value": 0.5}, {"not": {"stat": "n_tokens", "op": "<", "value": 3}}]},
            "action": "warn",
        },
        {"name": "c", "when": {"stat": "max_au", "op": ">=", "value": 3}, "action": "abstain", "early_stop": True},
    ],
    "retrieve": {"max_attempts": 2, "fallback": "human_review", "timeout_s": 5},
    "human_review": {"message": "id {review_id}"},
}


def _load(data: Any) -> None:
    with contextlib.suppress(ConfigurationError):  # PolicyError is one
        Policy.from_dict(data)


def _mutate(data: Any, path: list[Any], value: Any) -> Any:
    """``data`` with the node at ``path`` (as far as it exists) replaced by ``value``."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(data, dict) and data:
        k = list(data)[key % len(data)] if isinstance(key, int) else key
        return {**data, k: _mutate(data.get(k), rest, value)}
    if isinstance(data, list) and data:
        i = key % len(data) if isinstance(key, int) else 0
        return [*data[:i], _mutate(data[i], rest, value), *data[i + 1 :]]
    return value


@FUZZ
@given(DATA)
def test_arbitrary_data_is_a_policy_or_a_policy_error(data: Any) -> None:
    _load(data)
    if isinstance(data, dict):
        _load({"name": "p", **data})


@FUZZ
@given(st.lists(st.integers(min_value=0, max_value=50) | KEYS, max_size=5), DATA)
def test_mutated_valid_policies_are_a_policy_or_a_policy_error(path: list[Any], value: Any) -> None:
    _load(_mutate(VALID, path, value))


@FUZZ
@given(DATA, st.sampled_from([".yaml", ".json"]), st.booleans())
def test_policy_files_of_arbitrary_text_are_a_policy_or_a_policy_error(data: Any, suffix: str, as_yaml: bool) -> None:
    import yaml

    text = yaml.safe_dump(data, allow_unicode=True) if as_yaml else json.dumps(data)  # JSON with NaN/Infinity too
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"policy{suffix}"
        p.write_text(text, encoding="utf-8", errors="surrogatepass")
        with contextlib.suppress(ConfigurationError):
            Policy.from_file(p)


@FUZZ
@given(st.binary(max_size=300), st.sampled_from([".yaml", ".json"]))
def test_policy_files_of_arbitrary_bytes_are_a_policy_or_a_policy_error(raw: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"policy{suffix}"
        p.write_bytes(raw)
        with contextlib.suppress(ConfigurationError):
            Policy.from_file(p)


# -- the decision ------------------------------------------------------------------------------
NUMBERS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [math.nan, math.inf, -math.inf, 1e308, -1e308, 0.0, -0.0]
)
PROFILE = build_profile(
    [ScriptedBackend([ScriptedAnswer(["t"], [[float(v), 0.0]])], model_name="m").generate("q") for v in range(1, 30)], "fuzz"
)

DEFAULT = default_policy()
OTHERS = {u: Policy.from_dict({**VALID, "rules": VALID["rules"][1:], "undefined": u}) for u in ("least_reliable", "never_fires")}


def _stats(values: dict[str, float], n_tokens: float) -> ResponseStats:
    score = ResponseScore(
        reliability=values["reliability"],
        reliability_mean=values["reliability_mean"],
        probability_reliability=values["probability_reliability"],
        entropy_reliability=values["entropy_reliability"],
        top_n=2,
        n_tokens=0,
    )
    names = [
        n
        for n in STAT_NAMES
        if n not in {"reliability", "reliability_mean", "probability_reliability", "entropy_reliability", "n_tokens"}
    ]
    stats = {n: values[n] for n in names}
    if not math.isfinite(values["reliability"]):  # as with_guard_score makes it: no guard score without a reliability
        stats["guard_score"] = math.nan
    return ResponseStats(score=score, **stats, n_tokens=n_tokens)


@FUZZ
@given(st.fixed_dictionaries({name: NUMBERS for name in STAT_NAMES}), NUMBERS, st.sampled_from(["least_reliable", "never_fires"]))
def test_the_decision_never_raises_and_never_passes_an_undefined_answer(
    values: dict[str, float], n_tokens: float, undefined: str
) -> None:
    stats = _stats(values, n_tokens)
    d = DEFAULT.decide(stats, PROFILE)
    if math.isnan(stats.reliability) or stats.reliability == -math.inf:
        assert d.action != "pass" and d.rule is not None
        if math.isnan(stats.reliability):
            assert "undefined:" in d.reason
    for c in d.checks:
        c.describe()
    decision_payload(d)
    decision_payload(OTHERS[undefined].decide(stats, PROFILE))
    stats.as_dict()
