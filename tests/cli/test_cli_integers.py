"""Property test: every integer option of the CLI, given any integer (huge, negative), exits 0 or 2, never a traceback.

Model loading is replaced by a scripted backend (no weights), so values that pass validation run
the command to its end; values that cannot be used must be refused with status 2 and a message
naming the flag.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from cli_support import scripted_loader, wide_consoles  # noqa: F401 (wide_consoles: an autouse fixture)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from logtoku_guard import ScriptedAnswer, ScriptedBackend
from logtoku_guard.audit import AuditStore
from logtoku_guard.calibration import calibrate
from logtoku_guard.cli import _common, app

runner = CliRunner()
ANSWER = ScriptedAnswer(["Paris", "."], [[9.0, 1.0, 0.5], [3.0, 2.5, 0.1]])

# Small values (the edges 0, 1, 2), 64-bit edges, and integers of any size either way.
INTEGERS = st.one_of(
    st.integers(min_value=-3, max_value=4),
    st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
    st.integers(min_value=2**64, max_value=10**400),
    st.integers(max_value=-(2**64), min_value=-(10**400)),
)


@pytest.fixture(autouse=True)
def scripted_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "load_backend", scripted_loader(ANSWER))


@pytest.fixture(scope="module")
def folder() -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "prompts.txt").write_text("What is the capital of France?\nWho wrote Hamlet?\n")
        answers = [ScriptedAnswer(["a", "b"], [[3.0, 1.0, 0.2], [2.0, 1.5, 0.3]]) for _ in range(3)]
        calibrate(ScriptedBackend(answers, model_name="fake"), ["q1?", "q2?", "q3?"]).save(root / "profile.json")
        AuditStore(root / "audit.db").close()
        yield root


def commands(root: Path) -> dict[str, list[str]]:
    """Each integer option, with the other arguments its command needs (``{}`` marks the value)."""
    score = ["score", "hi?", "--model", "fake", "--cache-dir", str(root / "cache")]
    cal = ["calibrate", "--model", "fake", "--prompts", str(root / "prompts.txt"), "--out", str(root / "out.json")]
    ask = ["ask", "hi?", "--model", "fake", "--profile", str(root / "profile.json"), "--store", str(root / "audit.db")]
    return {
        "score --top-k": [*score, "--top-k", "{}"],
        "score --max-new-tokens": [*score, "--max-new-tokens", "{}"],
        "score --top-n": [*score, "--top-n", "{}"],
        "score --seed": [*score, "--temperature", "1", "--seed", "{}"],
        "calibrate --n": [*cal, "--n", "{}"],
        "calibrate --max-new-tokens": [*cal, "--max-new-tokens", "{}"],
        "calibrate --batch-size": [*cal, "--batch-size", "{}"],
        "calibrate --top-k": [*cal, "--top-k", "{}"],
        "ask --max-new-tokens": [*ask, "--max-new-tokens", "{}"],
        "ask --calibration-size": [*ask, "--calibration-size", "{}"],
        "audit tail -n": ["audit", "tail", "--store", str(root / "audit.db"), "-n", "{}"],
    }


OPTIONS = list(commands(Path("x")))


@pytest.mark.parametrize("option", OPTIONS)
# No shrinking: a failure prints its value already, and shrinking 400-digit integers through a CLI takes minutes.
@settings(
    max_examples=12,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@pytest.mark.slow
@given(value=INTEGERS)
def test_any_integer_exits_0_or_2_without_a_traceback(folder: Path, option: str, value: int) -> None:
    args = [str(value) if a == "{}" else a for a in commands(folder)[option]]
    res = runner.invoke(app, args)
    text = res.output
    assert res.exit_code in (0, 2), (option, value, res.exit_code, text[-2000:], res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), (option, value, repr(res.exception))
    assert "Traceback" not in text
    if res.exit_code == 2:
        flag = option.split()[-1]
        short = " ".join(text.split())
        # the message names the option (typer/click's own "Invalid value for '--x'" counts), or the value
        assert flag in short or str(value)[:20] in short or "top-K" in short, (option, value, short[-500:])
