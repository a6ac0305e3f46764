"""A one-off ``logtoku-guard ask`` imports only what it needs (issue 42 item 5, the cold start).

Each check runs the real console entry point (``logtoku_guard.cli.main``) in a fresh process and
reads ``sys.modules`` at its end: the CLI imports a command's module only when that command is
looked up (:class:`~logtoku_guard.cli.LazyGroup`), and a SQLite audit store never loads
SQLAlchemy's PostgreSQL dialect. The lazily built commands are checked equal to the same commands
registered eagerly (names, order, parameters, help). No timings are asserted: the cold start's
figures are ``benchmarks/bench_llamacpp.py --parts cold_ask`` (benchmarks/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

import logtoku_guard.cli as cli

TESTS = Path(__file__).resolve().parents[1]

RUN_CLI = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from support.scripted_cli import scripted_loader
    from logtoku_guard import ScriptedAnswer
    from logtoku_guard.cli import _common, main

    _common.load_backend = scripted_loader(ScriptedAnswer(["Paris", "."], [[30.0, 5.0], [25.0, 2.0]]))
    sys.argv = ["logtoku-guard", *sys.argv[2:]]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
    """
)
"""The console script in a fresh process, its model a scripted one (``_common.load_backend``, as
the CLI tests replace it); writes its exit code and ``sys.modules`` as the last line of stderr."""

OTHER_COMMANDS = {
    "logtoku_guard.cli.score",
    "logtoku_guard.cli.serve",
    "logtoku_guard.cli.audit",
    "logtoku_guard.cli.review_commands",
    "logtoku_guard.cli.review_serve",
}
"""The modules of the commands and groups other than ``calibrate`` and ``ask``."""


def run_cli(*args: str) -> tuple[int, str, set[str]]:
    """``logtoku-guard ARGS`` in a fresh process: its exit code, stdout and the modules it imported."""
    res = subprocess.run([sys.executable, "-c", RUN_CLI, str(TESTS), *args], capture_output=True, text=True, timeout=300)
    last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    assert last.startswith("MODULES "), res.stderr[-3000:]
    seen = json.loads(last.removeprefix("MODULES "))
    return seen["code"], res.stdout, set(seen["modules"])


CORE = ["score", "calibrate", "ask", "serve", "review", "audit"]


def _listed(help_text: str) -> list[str]:
    """The command names of a ``--help`` page's panels (not its options, not wrapped lines)."""
    rows = [line[2:].split() for line in help_text.splitlines() if line.startswith("│ ") and line[2:3] not in (" ", "-")]
    return [row[0] for row in rows if row]


@pytest.mark.slow  # a fresh interpreter per run: several seconds
def test_ask_imports_neither_the_other_commands_nor_the_postgresql_dialect(tmp_path: Path) -> None:
    store = tmp_path / "audit.db"
    code, out, modules = run_cli("ask", "--store", str(store), "What is the capital of France?")
    assert code == 0, out
    assert "Returned: Paris." in " ".join(out.split()), out
    assert modules & OTHER_COMMANDS == set(), sorted(modules & OTHER_COMMANDS)
    assert "logtoku_guard.cli.guard_commands" in modules  # the probe sees what ask imports
    # ask records every answer (docs/CLI.md): its store's database layer is loaded, the SQLite one only
    assert "sqlalchemy" in modules and "sqlalchemy.dialects.sqlite" in modules
    assert "sqlalchemy.dialects.postgresql" not in modules
    assert store.is_file()


@pytest.mark.slow  # a fresh interpreter per run: several seconds
def test_a_command_without_a_store_imports_no_sqlalchemy() -> None:
    code, out, modules = run_cli("score", "--max-new-tokens", "2", "What is the capital of France?")
    assert code == 0 and "Paris" in out, out
    assert not any(m == "sqlalchemy" or m.startswith("sqlalchemy.") for m in modules)
    assert "logtoku_guard.audit.store" not in modules
    assert modules & OTHER_COMMANDS == {"logtoku_guard.cli.score"}


def test_a_command_s_help_loads_only_that_command() -> None:
    code, out, modules = run_cli("ask", "--help")
    assert code == 0 and "--store" in out, out
    assert modules & OTHER_COMMANDS == set()
    assert "sqlalchemy" not in modules


def _eager_app() -> typer.Typer:
    """The core commands registered on a plain typer app, as the CLI registered them before it
    built them lazily."""
    import importlib

    eager = typer.Typer(help=cli.app.info.help, no_args_is_help=True, add_completion=False)
    eager.callback()(cli._root)
    for name, (module, attr) in cli.COMMANDS.items():
        eager.command(name)(getattr(importlib.import_module(module), attr))
    for name, (module, attr) in cli.GROUPS.items():
        eager.add_typer(getattr(importlib.import_module(module), attr), name=name)
    return eager


def _tree(command: Any, path: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
    """Each command's path, help and parameters (name, flags, default, help), walked as ``--help`` does."""
    params = [(p.name, tuple(getattr(p, "opts", ())), repr(p.default), getattr(p, "help", None)) for p in command.params]
    rows: list[tuple[Any, ...]] = [(path, command.help, command.short_help, tuple(params))]
    if hasattr(command, "list_commands"):
        ctx = command.context_class(command)
        for name in command.list_commands(ctx):
            rows += _tree(command.get_command(ctx, name), (*path, name))
    return rows


def test_the_lazy_commands_are_the_eagerly_registered_ones() -> None:
    lazy, eager = typer.main.get_command(cli.app), typer.main.get_command(_eager_app())
    assert _tree(lazy) == _tree(eager)
    top = [row[0][0] for row in _tree(lazy) if len(row[0]) == 1]
    assert top == ["score", "calibrate", "ask", "serve", "review", "audit"]
    review = [row[0][1] for row in _tree(lazy) if len(row[0]) == 2 and row[0][0] == "review"]
    assert review[-2:] == ["serve", "add-reviewer"]


@pytest.mark.parametrize("args", [["--help"], ["review", "--help"], ["ak"], ["review", "lst"], ["audit", "stats", "--help"]])
def test_help_and_typo_suggestions_read_as_with_eager_commands(args: list[str]) -> None:
    env = {"COLUMNS": "200", "TERMINAL_WIDTH": "200"}
    lazy, eager = CliRunner().invoke(cli.app, args, env=env), CliRunner().invoke(_eager_app(), args, env=env)
    assert (lazy.exit_code, lazy.output) == (eager.exit_code, eager.output)
    if args == ["ak"]:
        assert "Did you mean 'ask'?" in lazy.output


def test_plugins_are_found_only_when_a_name_outside_the_core_is_looked_up(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the core CLI's group, ``add_plugins`` reads the entry points when first needed, counts the
    lazily built core commands as taken (a plugin named ``ask`` is ignored, with the warning) and
    still answers ``eval`` with how to install the harness."""
    import logging
    from importlib.metadata import EntryPoint

    import logtoku_guard.cli.plugins as plugins

    asked: list[str] = []

    def entry_points(*, group: str) -> list[EntryPoint]:
        asked.append(group)
        return [EntryPoint("ask", "no_such_plugin_module:app", group)]

    monkeypatch.setattr(plugins, "entry_points", entry_points)
    app = typer.Typer(cls=cli.LazyGroup, no_args_is_help=True, add_completion=False)
    app.callback()(cli._root)  # typer makes a group of an app with a callback (its commands are all lazy here)
    plugins.add_plugins(app)
    env = {"COLUMNS": "200", "TERMINAL_WIDTH": "200"}
    res = CliRunner().invoke(app, ["ask", "--help"], env=env)
    assert res.exit_code == 0 and "--store" in res.output and asked == []
    with caplog.at_level(logging.WARNING, logger="logtoku_guard.cli.plugins"):
        missing = CliRunner().invoke(app, ["eval"], env=env)
    assert asked == [plugins.GROUP] and "'ask'" in caplog.text and "already exists" in caplog.text
    assert missing.exit_code == 2 and "pip install ./evaluation" in " ".join(missing.output.split())
    assert _listed(CliRunner().invoke(app, ["--help"], env=env).output) == [*CORE[:4], "eval", *CORE[4:]]


def test_the_console_script_lists_and_runs_the_installed_plugins() -> None:
    """``logtoku-guard --help`` (the console script, plugins added) lists the core commands and ``eval``
    (the harness, or its stand-in); ``ask`` loads no plugin."""
    code, out, _ = run_cli("--help")
    assert code == 0
    # the harness's group after the core groups, or its stand-in command before them where it is not installed
    assert _listed(out) in ([*CORE, "eval"], [*CORE[:4], "eval", *CORE[4:]]), out
    _, _, ask_modules = run_cli("ask", "--help")
    assert not any(m.startswith("logtoku_eval") for m in ask_modules)
    assert "logtoku_guard.cli.toolkit" not in ask_modules
