"""Every help text of the CLI shows what it says: typer renders help as Rich markup, where an
unescaped ``[llamacpp]`` is taken for a style tag and vanishes (``pip install 'logtoku-guard'``).

The walk covers every command and option of ``logtoku-guard`` (the ``eval`` plugin's:
``evaluation/tests/test_eval_help_texts.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.help_texts import check_help_texts
from typer.testing import CliRunner

from logtoku_guard.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_no_help_text_has_an_unescaped_bracket_and_every_escaped_one_shows() -> None:
    shown = check_help_texts(app)
    assert shown >= 3  # ask, score, serve, calibrate... name the llamacpp extra


@pytest.mark.parametrize("command", ["serve", "ask"])
def test_backend_help_installs_the_llamacpp_extra_with_its_brackets(command: str) -> None:
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    flat = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 0 and "pip install 'logtoku-guard[llamacpp]'" in flat, flat


def test_the_readme_context_file_is_shipped_and_reads_as_passages() -> None:
    from logtoku_guard.cli._common import read_context_file

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = re.findall(r"--context-file\s+(\S+)", readme)
    assert named, "the README shows ask --context-file"
    for name in named:
        path = ROOT / name
        assert path.is_file(), f"the README names {name}, which the checkout does not ship"
        retriever = read_context_file(path)
        found = retriever.retrieve("Who founded the Zarnovian Institute of Quantum Botany?")
        assert found and "Zarnovian" in found[0]
