"""``ask --backend openai --base-url URL`` guards a remote server (the real app on 127.0.0.1 sockets)
with the decision and scores of the same model guarded here."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from logtoku_guard.cli import _common, app
from logtoku_guard.server import BackgroundServer, ServerSettings, build_app

KEY = "remote-key"
QUESTION = "What is the capital of France?"


def _ask(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["ask", "--json", "--max-new-tokens", "12", *args, QUESTION], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_ask_through_a_remote_server_decides_as_the_local_backend(tiny_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with BackgroundServer(build_app(tiny_backend, settings=ServerSettings(api_key=KEY))) as srv:
        remote = _ask("--backend", "openai", "--base-url", srv.base_url, env={"LOGTOKU_GUARD_REMOTE_API_KEY": KEY})
        refused = CliRunner().invoke(
            app,
            ["ask", "--backend", "openai", "--base-url", srv.base_url, QUESTION],
            env={"LOGTOKU_GUARD_REMOTE_API_KEY": "wrong", "OPENAI_API_KEY": ""},
        )
    assert refused.exit_code != 0 and "401" in refused.output
    monkeypatch.setattr(_common, "load_backend", lambda *a, **k: tiny_backend)
    local = _ask()
    assert remote["model"] == local["model"] == tiny_backend.model_name
    assert (remote["action"], remote["reason"], remote["answer"]) == (local["action"], local["reason"], local["answer"])
    for stat in ("reliability", "guard_score", "max_eu", "mean_au"):
        a, b = remote["stats"].get(stat), local["stats"].get(stat)
        assert (a is None) == (b is None), stat
        if a is not None:
            assert a == pytest.approx(b, abs=1e-6), stat


def test_the_remote_backend_needs_an_address_and_nothing_local() -> None:
    missing = CliRunner().invoke(app, ["ask", "--backend", "openai", QUESTION])
    assert missing.exit_code != 0 and "--backend openai needs the server's address: --base-url" in missing.output
    local_only = CliRunner().invoke(
        app, ["ask", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--device", "cuda", QUESTION]
    )
    assert local_only.exit_code != 0 and "apply to the transformers backend" in local_only.output
    stray = CliRunner().invoke(app, ["ask", "--base-url", "http://127.0.0.1:9/v1", QUESTION])
    assert stray.exit_code != 0 and "--base-url is for --backend openai" in stray.output
