"""Walking a typer app's help texts: each command's and option's, as Rich renders them.

typer renders help as Rich markup, where an unescaped ``[llamacpp]`` is taken for a style tag and
vanishes; :func:`check_help_texts` asserts there is none, and that every escaped one shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer
import typer.rich_utils  # read here, at collection: it reads TERMINAL_WIDTH once, at its import
from typer.testing import CliRunner

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


def check_help_texts(cli: Any) -> int:
    """Assert no help text of ``cli`` holds an unescaped ``[word]`` and each escaped one is shown; how many were."""
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
    return shown
