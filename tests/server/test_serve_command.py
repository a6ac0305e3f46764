"""The ``serve`` typer command (registered as ``logtoku-guard serve`` by the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

typer = pytest.importorskip("typer")
from typer.testing import CliRunner  # noqa: E402

from logtoku_guard.cli.serve import serve  # noqa: E402


def app() -> typer.Typer:
    a = typer.Typer()
    a.command()(serve)
    return a


def test_help_lists_the_options() -> None:
    out = CliRunner().invoke(app(), ["--help"]).output
    options = ("--host", "--port", "--model", "--api-key", "--max-batch", "--policy", "--allow-remote", "--top-k")
    for option in (*options, "--prefix-cache-mb", "--prefill-chunk"):
        assert option in out


def test_non_loopback_host_is_refused_before_loading_a_model() -> None:
    result = CliRunner().invoke(app(), ["--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--allow-remote" in result.output


def test_a_negative_prefix_cache_is_refused_before_loading_a_model() -> None:
    result = CliRunner().invoke(app(), ["--prefix-cache-mb", "-1", "--model", "/nonexistent/model"])
    assert result.exit_code == 2 and "--prefix-cache-mb" in result.output and "0 disables" in result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--port", "70000"], "--port must be a TCP port from 1 to 65535, got 70000"),
        (["--port", "-1"], "got -1"),
        (["--graceful-timeout", "nan"], "--graceful-timeout must be a finite number"),
        (["--graceful-timeout", "inf"], "got inf"),
        (["--api-key", ""], "--api-key is empty"),
        (["--api-key", " secret"], "--api-key must be printable ASCII without spaces"),
        (["--store", "audit.db"], "--store records the guard's decisions: give a --policy too"),
        (["--logprobs-mode", "logits"], "--logprobs-mode must be one of raw_logprobs, raw_logits, got 'logits'"),
        (["--prefill-chunk", "64"], "--prefill-chunk must be at least 128 tokens (0: prefill prompts whole), got 64"),
    ],
    ids=[
        "port-70000",
        "port-negative",
        "graceful-nan",
        "graceful-inf",
        "api-key-empty",
        "api-key-space",
        "store-alone",
        "mode",
        "prefill-chunk",
    ],
)
def test_bad_settings_exit_2_before_any_url_or_model(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app(), [*args, "--model", "/nonexistent/model"])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "http://" not in result.output and "Traceback" not in result.output
    assert "/nonexistent/model" not in result.output  # refused before the model is looked for


def test_a_port_in_use_is_a_clear_error_before_the_model_loads() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app(), ["--port", str(port), "--model", "/nonexistent/model"])
    assert result.exit_code == 2, result.output
    assert f"port {port} on 127.0.0.1 is already in use" in result.output and "--port" in result.output
    assert "http://" not in result.output and "/nonexistent/model" not in result.output


def test_a_profile_that_is_not_a_profile_is_refused_without_echoing_its_content(tmp_path: Path) -> None:
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n", encoding="utf-8")
    result = CliRunner().invoke(app(), ["--profile", str(secret), "--model", "/nonexistent/model"])
    assert result.exit_code == 2, result.output
    assert "is not a model profile" in result.output and "root:x" not in result.output and "Traceback" not in result.output


def test_an_empty_api_key_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LOGTOKU_GUARD_API_KEY=""`` must not start an open server (click reads an empty variable as unset)."""
    monkeypatch.setenv("LOGTOKU_GUARD_API_KEY", "")
    result = CliRunner().invoke(app(), ["--model", "/nonexistent/model"])
    assert result.exit_code == 2 and "LOGTOKU_GUARD_API_KEY is set but empty" in result.output, result.output


def test_a_human_review_policy_without_a_store_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    policy = tmp_path / "p.json"
    rule = {"name": "r", "when": {"stat": "reliability", "op": "<", "value": 0.0}, "action": "human_review"}
    policy.write_text(json.dumps({"name": "review", "rules": [rule]}))
    result = CliRunner().invoke(app(), ["--policy", str(policy), "--model", "/nonexistent/model"])
    flat = " ".join(result.output.split())
    assert result.exit_code == 2 and "needs a review queue: pass --store" in flat and "/nonexistent/model" not in flat, flat
