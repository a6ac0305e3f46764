"""``audit stats``: flag rates and score quantiles per day or week against the profile, and drift.

Two weeks of decisions: the first flags as many answers as the profile's calibration answers
predict (no drift), the second far fewer (drift, on stderr and in the JSON). The expected rate
is the share of the profile's calibration answers below the default policy's threshold.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cli_support import make_record
from typer.testing import CliRunner

from logtoku_guard import AuditStore
from logtoku_guard.calibration import ModelProfile
from logtoku_guard.calibration.drift import expected_flag_rate, period_of
from logtoku_guard.calibration.profiles import shipped_profile_path
from logtoku_guard.cli import app

PROFILE = shipped_profile_path("smollm2-135m-instruct")
WEEK1 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)  # ISO week 45
WEEK2 = WEEK1 + timedelta(days=7)


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def store(tmp_path: Path) -> str:
    path = tmp_path / "audit.db"
    with AuditStore(path) as audit:
        for week, flagged in ((WEEK1, 16), (WEEK2, 2)):
            for i in range(20):
                hit = i < flagged
                audit.record(
                    make_record(
                        model="smollm2-135m-instruct [bold]",
                        created_at=week + timedelta(hours=i),
                        action="retrieve" if hit else "pass",
                        rule="low-guard-score" if hit else None,
                        stats={"guard_score": 0.05 if hit else 0.6 + i / 100, "max_eu": 0.2 + i / 100},
                    )
                )
    return str(path)


def test_expected_rate_is_the_profiles_share_below_the_default_threshold() -> None:
    profile = ModelProfile.load(PROFILE)
    rate = expected_flag_rate(profile)
    assert rate is not None and rate == pytest.approx(profile.percentile("guard_score", 0.27969))
    assert expected_flag_rate(None) is None
    assert period_of(WEEK1, "week") == "2026-W45" and period_of(WEEK1, "day") == "2026-11-02"


def test_audit_stats_reports_each_week_and_the_drift(store: str) -> None:
    res = invoke("audit", "stats", "--store", store, "--profile", str(PROFILE), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    first, second = data["periods"]
    assert (first["period"], second["period"]) == ("2026-W45", "2026-W46")
    assert first["answers"] == 20 and first["flag_rate"] == 0.8 and first["rule_flag_rates"] == {"low-guard-score": 0.8}
    assert second["flag_rate"] == 0.1 and second["drift"] is True and first["drift"] is False
    lo, hi = second["flag_rate_interval"]
    assert lo < 0.1 < hi < first["expected_flag_rate"]
    assert first["guard_score_quantiles"]["q10"] == 0.05 and second["max_eu_quantiles"]["q50"] == pytest.approx(0.3)
    assert "drift: smollm2-135m-instruct [bold], 2026-W46: 10% of 20 answers flagged" in res.stderr
    assert "2026-W45" not in res.stderr


def test_audit_stats_by_day_since_and_as_a_table(store: str) -> None:
    res = invoke("audit", "stats", "--store", store, "--by", "day", "--since", "2026-11-09", "--json")
    assert res.exit_code == 0, res.output
    periods = json.loads(res.stdout)["periods"]
    assert [p["period"] for p in periods] == ["2026-11-09", "2026-11-10"] and sum(p["answers"] for p in periods) == 20
    assert all(p["expected_flag_rate"] is None for p in periods)  # no profile for this model name: nothing expected
    table = invoke("audit", "stats", "--store", store, "--profile", str(PROFILE))
    assert table.exit_code == 0 and "2026-W46" in table.output and "smollm2-135m-instruct [bold]" in table.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--by", "month"], "--by must be 'day' or 'week'"), (["--since", "last week"], "--since must be an ISO date")],
)
def test_bad_options_are_refused(store: str, args: list[str], needle: str) -> None:
    res = invoke("audit", "stats", "--store", store, *args)
    assert res.exit_code == 2 and needle in " ".join(res.output.split())
