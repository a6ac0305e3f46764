"""``--policy NAME``: a shipped policy's name resolves like a file on every command that takes --policy
(``ask``, ``serve``, ``eval ordinary``), through :meth:`Policy.load`; a file still wins over a name."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path
from typing import Any

import pytest
from cli_support import scripted_loader
from rich.console import Console
from test_cli import ANSWER, make_profile
from typer.testing import CliRunner

from logtoku_guard import Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import ModelProfile, calibrate
from logtoku_guard.calibration.guard_fit import shipped_guard
from logtoku_guard.cli import _common, app
from logtoku_guard.decision.policy import shipped_policies
from logtoku_guard.errors import ConfigurationError, PolicyError

runner = CliRunner()


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    monkeypatch.setattr(_common, "load_backend", scripted_loader(ANSWER, calls))
    monkeypatch.setattr(_common, "out", Console(width=1000))
    monkeypatch.setattr(_common, "err", Console(width=1000, stderr=True))
    return calls


def guarded_profile() -> ModelProfile:
    """A profile of the CLI's scripted model ("fake", K = 2) with the embedded model's shipped guard, so the
    cascade's stated-risk thresholds can be chosen."""
    rng = random.Random(0)
    answers = [ScriptedAnswer(["w"] * 4, [[rng.uniform(0, 12) for _ in range(3)] for _ in range(4)]) for _ in range(8)]
    backend = ScriptedBackend(answers, k=2, model_name="fake")
    return calibrate(backend, [f"question {i}?" for i in range(8)], guard=shipped_guard("smollm2-135m-instruct"))


def test_policy_load_resolves_shipped_names_files_and_refuses_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "cascade" in shipped_policies()
    assert Policy.load("cascade") == Policy.named("cascade")
    assert Policy.load("default") == Policy.named("default")
    assert Policy.load(Path("cascade")).name == "cascade"
    with pytest.raises(PolicyError) as err:
        Policy.load("cascad")
    assert "'cascad'" in str(err.value) and "default, cascade" in str(err.value) and "policy file" in str(err.value)
    # a path is a path: a missing file is the file's error, never a name look-up
    with pytest.raises(PolicyError, match=r"missing\.yaml"):
        Policy.load(tmp_path / "missing.yaml")
    with pytest.raises(PolicyError, match=r"cascade\.yaml"):
        Policy.load("no/such/cascade.yaml")
    # an existing file of that name wins over the shipped name
    monkeypatch.chdir(tmp_path)
    rule = {"name": "r", "when": {"stat": "reliability", "op": "<", "value": -1.0}, "action": "abstain"}
    Path("cascade").write_text(json.dumps({"name": "mine", "rules": [rule]}))
    assert Policy.load("cascade").name == "mine"


def test_ask_policy_cascade_decides_with_the_shipped_cascade(tmp_path: Path, loads: list[Any]) -> None:
    path = guarded_profile().save(tmp_path / "p.json")
    common = ("ask", "hi", "--model", "fake", "--profile", str(path), "--store", str(tmp_path / "a.db"), "--json")
    res = runner.invoke(app, [*common, "--policy", "cascade"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    cascade = Policy.named("cascade")
    assert data["policy"] == {"name": cascade.name, "version": cascade.version}
    assert data["rule"] in {None, *(r.name for r in cascade.rules)}
    res = runner.invoke(app, [*common, "--policy", "default"])
    assert res.exit_code == 0 and json.loads(res.stdout)["policy"]["name"] == Policy.named("default").name
    # a profile without a fitted guard: the cascade's band edges fall back to quantiles of reliability
    bare = make_profile().save(tmp_path / "bare.json")
    res = runner.invoke(app, ["ask", "hi", "--model", "fake", "--profile", str(bare), "--json", "--policy", "cascade"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policy"]["name"] == "cascade"


def test_ask_refuses_an_unknown_policy_name_before_loading_a_model(tmp_path: Path, loads: list[Any]) -> None:
    res = runner.invoke(app, ["ask", "hi", "--policy", "cascad", "--store", str(tmp_path / "a.db")])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "'cascad'" in out and "default, cascade" in out, res.output
    assert loads == []


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_serve_policy_cascade_resolves_before_the_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from logtoku_guard.backends import registry

    seen: list[str] = []

    def stop(name: str, settings: Any) -> Any:
        seen.append(name)
        msg = "stopped at the backend (the policy was accepted)"
        raise ConfigurationError(msg)

    monkeypatch.setattr(registry, "create_backend", stop)
    res = runner.invoke(app, ["serve", "--port", _free_port(), "--policy", "cascade"])
    assert res.exit_code == 2 and "the policy was accepted" in " ".join(res.output.split()), res.output
    assert seen == ["transformers"]
    res = runner.invoke(app, ["serve", "--port", _free_port(), "--policy", "cascad"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "'cascad'" in out and "default, cascade" in out and seen == ["transformers"], res.output
