"""Every help text of the CLI shows what it says: typer renders help as Rich markup, where an
unescaped ``[llamacpp]`` is taken for a style tag and vanishes (``pip install 'logtoku-guard'``).

The walk covers every command and option of ``logtoku-guard``, the ``eval`` plugin's included.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from logtoku_guard.cli import app

ROOT = Path(__file__).resolve().parents[2]
BRACKET = re.compile(r"(?<!\\)\[([a-zA-Z][\w,.-]*)\]")
"""A ``[word]`` Rich reads as markup (``\\[word]`` is its escaped, literal form)."""
ESCAPED = re.compile(r"\\\[([a-zA-Z][\w,.-]*)\]")


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, group
    if hasattr(group, "list_commands"):  # a group (typer's own click: not an instance of click.Group)
        ctx = group.context_class(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, name
            yield from commands(command, (*path, name))


def help_texts(command: Any) -> Iterator[str]:
    for text in (command.help, command.short_help, command.epilog):
        if text:
            yield text
    for param in command.params:
        text = getattr(param, "help", None)
        if text:
            yield text


def apps() -> list[tuple[str, Any]]:
    """The core CLI and, where the harness is installed, its ``eval`` plugin."""
    found = [("logtoku-guard", app)]
    if importlib.util.find_spec("logtoku_eval") is not None:
        from logtoku_eval.cli import eval_app

        found.append(("eval", eval_app))
    return found


@pytest.mark.parametrize(("name", "cli"), apps(), ids=[name for name, _ in apps()])
def test_no_help_text_has_an_unescaped_bracket_and_every_escaped_one_shows(name: str, cli: Any) -> None:
    root = typer.main.get_command(cli)
    walked = list(commands(root))
    assert len(walked) > 5, [path for path, _ in walked]
    unescaped = [
        (" ".join(path), m.group(0)) for path, command in walked for text in help_texts(command) for m in BRACKET.finditer(text)
    ]
    assert unescaped == [], f"escape these as \\[...] (Rich markup eats them): {unescaped}"
    runner = CliRunner()
    shown = 0
    for path, command in walked:
        wanted = {f"[{m.group(1)}]" for text in help_texts(command) for m in ESCAPED.finditer(text)}
        if not wanted:
            continue
        res = runner.invoke(cli, [*path, "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
        assert res.exit_code == 0, res.output
        flat = " ".join(res.output.replace("│", " ").split())
        for item in wanted:
            assert item in flat, f"{' '.join(path)} --help lost {item}: {flat}"
            shown += 1
    assert shown >= (3 if name == "logtoku-guard" else 0)  # ask, score, serve, calibrate... name the llamacpp extra


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
