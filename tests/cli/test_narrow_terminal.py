"""At 80 columns the tables keep every value whole and the help texts read as prose (issue 44).

``audit stats`` and ``review list`` used to cut each column to a stub ("2026-W…", "gemma-…"), and
``calibrate --help`` showed reStructuredText markup (````--labels````) and lines broken mid-sentence
(typer keeps a docstring's single line breaks in its rich mode, then wraps each line again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from cli_support import make_record
from support.help_texts import commands
from typer.testing import CliRunner

from logtoku_guard.audit import AuditStore
from logtoku_guard.cli import app

NARROW = {"COLUMNS": "80", "TERMINAL_WIDTH": "80"}
LONG_MODEL = "smollm2-135m-instruct@llamacpp"
QUESTION = "Who founded the Velmora Institute of Marine Acoustics?"


@pytest.fixture
def store(tmp_path: Path) -> str:
    path = tmp_path / "audit.db"
    stats: dict[str, Any] = {"guard_score": 0.04561, "max_eu": 0.1234}
    with AuditStore(path) as audit:
        for _ in range(3):
            audit.record_for_review(
                make_record(
                    model=LONG_MODEL,
                    prompt=QUESTION,
                    rule="low-guard-score",
                    reason="guard_score 0.04561 < 0.2797 (chosen so that it passes at least 80% of correct answers)",
                    stats=stats,
                )
            )
            audit.record(make_record(model="gemma3-270m@llamacpp", action="pass", rule=None, stats={**stats, "guard_score": 0.9}))
        audit.record(make_record(model=LONG_MODEL, action="abstain", rule="lost-early", stats=stats))
    return str(path)


def _invoke(*args: str) -> str:
    res = CliRunner().invoke(app, list(args), env=NARROW)
    assert res.exit_code == 0, res.output
    return res.stdout


def _fits(output: str) -> list[str]:
    lines = output.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert "…" not in output, output  # nothing cut
    return lines


def test_audit_stats_keeps_every_value_whole(store: str) -> None:
    out = _invoke("audit", "stats", "--by", "week", "--store", store)
    lines = _fits(out)
    assert any(LONG_MODEL in line for line in lines) and any("gemma3-270m@llamacpp" in line for line in lines), out
    period = next(w for line in lines for w in line.split() if "-W" in w)
    assert len(period) == 8, period  # 2026-W48, whole
    words = out.split()
    assert "low-guard-score" in words and "75%" in words and "lost-early" in words and "25%" in words, out  # rules whole
    assert "0.046 0.046 0.046" in out and "0.123" in out, out  # guard_score q10 q50 q90 and max_eu, whole


def test_review_list_and_audit_tail_keep_names_and_dates_whole(store: str) -> None:
    for args in (("review", "list"), ("audit", "tail")):
        out = _invoke(*args, "--store", store)
        lines = _fits(out)
        flat = " ".join(" ".join(line.split()) for line in lines)
        assert "Velmora" in flat and ("low-guard-score" in out if args[0] == "audit" else "pending" in out), out
        date = next(w for line in lines for w in line.split() if w.count("-") == 2 and w[:2] == "20")
        assert len(date) == 10, out  # 2026-11-28, whole


def test_every_help_paragraph_is_one_line_of_plain_words() -> None:
    """A docstring paragraph with a line break renders broken at any width; ``x`` markup shows as is."""
    root = typer.main.get_command(app)
    for path, command in commands(root):
        text = command.help or ""
        assert "``" not in text, f"{' '.join(path)}: reStructuredText markup in its help"
        for paragraph in text.strip().split("\n\n"):
            assert "\n" not in paragraph.strip(), f"{' '.join(path)}: a help paragraph broken across lines: {paragraph!r}"


def test_calibrate_help_reads_as_prose_at_80_columns() -> None:
    res = CliRunner().invoke(app, ["calibrate", "--help"], env=NARROW)
    assert res.exit_code == 0 and "``" not in res.output
    flat = " ".join(res.output.replace("│", " ").split())
    assert "With --labels-from-store URL: refit on your reviewers' verdicts, kept only if strictly better" in flat, flat
    assert "--no-fit-guard leaves it out: guard_score is then unavailable" in flat
