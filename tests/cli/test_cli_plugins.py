"""Command groups from other distributions (``logtoku_guard.cli.plugins``): found through the
entry-point group ``logtoku_guard.cli``; ``eval`` answers with how to install the harness when absent."""

from __future__ import annotations

import logging
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import typer
from cli_support import wide_consoles  # noqa: F401 (an autouse fixture)
from typer.testing import CliRunner

from logtoku_guard.cli.plugins import GROUP, add_plugins


def _app() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, add_completion=False)

    @app.command()
    def ask() -> None:
        """A core command."""

    return app


def _plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hello_plugin.py").write_text(
        textwrap.dedent(
            """
            import typer
            app = typer.Typer()

            @app.command()
            def greet(name: str) -> None:
                print(f"hello {name}")

            @app.command()
            def wave() -> None:
                print("waves")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("args", [["eval"], ["eval", "--help"], ["eval", "truthfulqa", "--limit", "3"]])
def test_eval_without_the_harness_exits_2_and_says_how_to_install_it(args: list[str]) -> None:
    app = _app()
    add_plugins(app, [])
    res = CliRunner().invoke(app, args)
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text, text
    assert "logtoku-guard-eval" in text and "pip install ./evaluation" in text and "install.sh --eval" in text
    listed = " ".join(CliRunner().invoke(app, ["--help"]).output.split())
    assert "eval" in listed and "Benchmarks" in listed


def test_a_registered_group_becomes_a_subcommand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(tmp_path, monkeypatch)
    app = _app()
    add_plugins(app, [EntryPoint("hello", "hello_plugin:app", GROUP)])
    res = CliRunner().invoke(app, ["hello", "greet", "world"])
    assert res.exit_code == 0 and "hello world" in res.output, res.output
    eval_missing = CliRunner().invoke(app, ["eval"])
    assert eval_missing.exit_code == 2  # the known group still answers where nothing provides it


def test_a_group_that_fails_to_import_answers_with_the_error_and_the_rest_keeps_working() -> None:
    app = _app()
    add_plugins(app, [EntryPoint("eval", "logtoku_eval_missing_module.cli:eval_app", GROUP)])
    res = CliRunner().invoke(app, ["eval", "--help"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "failed to import" in text and "logtoku_eval_missing_module" in text, text
    assert "pip install ./evaluation" in text
    assert CliRunner().invoke(app, ["ask"]).exit_code == 0


def test_a_group_named_like_a_core_command_is_ignored_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _plugin(tmp_path, monkeypatch)
    app = _app()
    with caplog.at_level(logging.WARNING, logger="logtoku_guard.cli.plugins"):
        add_plugins(app, [EntryPoint("ask", "hello_plugin:app", GROUP)])
    assert "'ask'" in caplog.text and "already exists" in caplog.text
    res = CliRunner().invoke(app, ["ask"])
    assert res.exit_code == 0 and "waves" not in res.output


def test_the_core_cli_reads_the_installed_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """``add_plugins`` without a list asks importlib.metadata for the group."""
    import logtoku_guard.cli.plugins as plugins

    asked: list[str] = []

    def fake_entry_points(*, group: str) -> list[EntryPoint]:
        asked.append(group)
        return []

    monkeypatch.setattr(plugins, "entry_points", fake_entry_points)
    add_plugins(_app())
    assert asked == ["logtoku_guard.cli"]


def test_a_plugin_that_imports_the_core_cli_can_be_imported_first(tmp_path: Path) -> None:
    """A plugin module importing ``logtoku_guard.cli`` (for its shared options) before the core
    CLI was imported must not be loaded again half-initialised through its own entry point."""
    import subprocess
    import sys

    (tmp_path / "hello_cycle.py").write_text(
        "import typer\nfrom logtoku_guard.cli import toolkit  # noqa: F401\napp = typer.Typer()\n"
        "@app.command()\ndef wave() -> None:\n    typer.echo('waves')\n",
        encoding="utf-8",
    )
    dist = tmp_path / "hello_cycle-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-cycle\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(f"[{GROUP}]\nhello = hello_cycle:app\n", encoding="utf-8")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import hello_cycle; "
        "sys.argv = ['logtoku-guard', 'hello', 'wave']; from logtoku_guard.cli import main; main()"
    )
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "waves", res.stderr


def test_a_plugin_built_from_the_public_toolkit_checks_and_fails_like_a_core_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:mod:`logtoku_guard.cli.toolkit` is what a plugin needs: the shared options, the checks
    before loading, ``fail`` (exit 2, one error line) and a ``load_backend`` a test can replace."""
    (tmp_path / "toolkit_plugin.py").write_text(
        textwrap.dedent(
            """
            import typer
            from logtoku_guard.cli import toolkit
            from logtoku_guard.cli.toolkit import BackendOpt, DeviceOpt
            from logtoku_guard.errors import ConfigurationError
            app = typer.Typer()

            @app.command()
            def run(model: toolkit.ModelOpt = "m", backend: BackendOpt = "transformers", device: DeviceOpt = "auto") -> None:
                try:
                    toolkit.check_backend(backend, device)
                except ConfigurationError as exc:
                    raise toolkit.fail(exc) from exc
                loaded = toolkit.load_backend(model, 2, device, "auto", None, backend=backend)
                toolkit.print_json({"model": loaded.model_name})

            @app.command()
            def other() -> None:
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from support.scripted_cli import scripted_loader

    from logtoku_guard.backends.fake import ScriptedAnswer
    from logtoku_guard.cli import toolkit

    backends: list[str] = []
    monkeypatch.setattr(toolkit, "load_backend", scripted_loader(ScriptedAnswer(["x"], [[5.0, 1.0]]), backends=backends))
    app = _app()
    add_plugins(app, [EntryPoint("hello", "toolkit_plugin:app", GROUP)])
    bad = CliRunner().invoke(app, ["hello", "run", "--backend", "vllm"])
    assert bad.exit_code == 2 and "error: --backend must be one of transformers, llamacpp, openai, got 'vllm'" in bad.output
    assert "Traceback" not in bad.output and backends == []
    good = CliRunner().invoke(app, ["hello", "run", "--model", "mine", "--backend", "llamacpp"])
    assert good.exit_code == 0 and '{"model": "mine"}' in good.output and backends == ["llamacpp"], good.output


def test_the_toolkit_documents_every_name_it_exports() -> None:
    from logtoku_guard.cli import toolkit

    assert toolkit.__doc__ is not None
    undocumented = [
        name for name in toolkit.__all__ if f":data:`{name}`" not in toolkit.__doc__ and f":func:`{name}`" not in toolkit.__doc__
    ]
    assert not undocumented, undocumented
    assert all(hasattr(toolkit, name) for name in toolkit.__all__)


@pytest.mark.parametrize(
    ("source", "value", "expected"),
    [
        ("raise RuntimeError('boom at import')", "broken_plugin_raises:app", "RuntimeError: boom at import"),
        ("import typer\nother = typer.Typer()", "broken_plugin_no_app:app", "AttributeError"),
        ("app = 42", "broken_plugin_not_typer:app", "is a int, not a typer.Typer command group"),
    ],
)
def test_a_broken_plugin_answers_with_its_error_and_the_core_cli_keeps_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, value: str, expected: str
) -> None:
    (tmp_path / f"{value.split(':')[0]}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    app = _app()
    add_plugins(app, [EntryPoint("hello", value, GROUP)])
    res = CliRunner().invoke(app, ["hello", "greet"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text and expected in text, text
    assert CliRunner().invoke(app, ["ask"]).exit_code == 0
