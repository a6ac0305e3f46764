"""The ``serve`` typer command (registered as ``logtoku-guard serve`` by the CLI)."""

from __future__ import annotations

import pytest

typer = pytest.importorskip("typer")
from typer.testing import CliRunner  # noqa: E402

from logtoku_guard.server.command import serve  # noqa: E402


def app() -> typer.Typer:
    a = typer.Typer()
    a.command()(serve)
    return a


def test_help_lists_the_options() -> None:
    out = CliRunner().invoke(app(), ["--help"]).output
    options = ("--host", "--port", "--model", "--api-key", "--max-batch", "--policy", "--allow-remote", "--top-k")
    for option in (*options, "--prefix-cache-mb"):
        assert option in out


def test_non_loopback_host_is_refused_before_loading_a_model() -> None:
    result = CliRunner().invoke(app(), ["--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--allow-remote" in result.output


def test_a_negative_prefix_cache_is_refused_before_loading_a_model() -> None:
    result = CliRunner().invoke(app(), ["--prefix-cache-mb", "-1", "--model", "/nonexistent/model"])
    assert result.exit_code == 2 and "--prefix-cache-mb" in result.output and "0 disables" in result.output
