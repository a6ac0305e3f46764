"""The CLI over scripted logits (no model): review and audit on a guard-filled store; score's thresholds."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from cli_support import CliBackend, scripted_loader
from rich.console import Console
from typer.testing import CliRunner

from logtoku_guard import AuditStore, Guard, Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import ModelProfile, calibrate, profile_path
from logtoku_guard.cli import _common, app
from logtoku_guard.errors import LogTokUError
from logtoku_guard.scoring.quadrants import QuadrantThresholds

runner = CliRunner()
LOST = ScriptedAnswer(["Zorg", " Q"], [[0.6, 0.5], [0.5, 0.4]])
SURE = ScriptedAnswer(["Paris", "."], [[30.0, 5.0], [25.0, 2.0]])


@pytest.fixture
def store(tmp_path: Path) -> str:
    path = tmp_path / "audit.db"
    policy = Policy.from_dict(
        {"name": "p", "rules": [{"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "human_review"}]}
    )
    with AuditStore(path) as audit:
        guard = Guard(ScriptedBackend(lambda m: LOST if "Zarn" in m[-1].content else SURE), policy, store=audit)
        guard.run("What is the capital of France?")
        guard.run("Who founded Zarnovia?")
        guard.run("Who founded Zarnland?")
    return str(path)


def invoke(*args: str) -> object:
    return runner.invoke(app, list(args))


def test_review_life_cycle_from_the_command_line(store: str) -> None:
    res = invoke("review", "list", "--store", store, "--json")
    assert res.exit_code == 0, res.output
    items = json.loads(res.output)["items"]
    assert [i["prompt"] for i in items] == ["Who founded Zarnovia?", "Who founded Zarnland?"]
    first, second = items[0]["id"], items[1]["id"]

    res = invoke("review", "show", str(first), "--store", store)
    assert res.exit_code == 0 and "Who founded Zarnovia?" in res.output and "Zorg Q" in res.output and "lost" in res.output

    assert invoke("review", "claim", str(first), "-r", "alice", "--store", store).exit_code == 0
    res = invoke("review", "claim", str(first), "-r", "bob", "--store", store)
    assert res.exit_code == 2 and "alice" in res.output
    res = invoke("review", "approve", str(first), "-r", "alice", "--answer", "Nobody knows.", "--store", store)
    assert res.exit_code == 0 and "approved by alice" in res.output
    res = invoke("review", "approve", str(first), "-r", "alice", "--store", store)
    assert res.exit_code == 2 and "approved" in res.output  # deciding twice is an error naming the status

    res = invoke("review", "reject", str(second), "-r", "bob", "--note", "invented entity", "--store", store)
    assert res.exit_code == 0 and "rejected by bob" in res.output
    res = invoke("review", "reject", "999", "-r", "bob", "--note", "x", "--store", store)
    assert res.exit_code == 2 and "999" in res.output
    assert json.loads(invoke("review", "list", "--store", store, "--json").output)["items"] == []
    with AuditStore(store) as audit:
        item = audit.review_item(first)
        assert (item.status, item.reviewer, item.edited_answer) == ("approved", "alice", "Nobody knows.")


def test_audit_tail_export_and_purge(store: str, tmp_path: Path) -> None:
    res = invoke("audit", "tail", "-n", "2", "--store", store, "--json")
    assert res.exit_code == 0
    records = json.loads(res.output)["records"]
    assert [r["prompt"] for r in records] == ["Who founded Zarnland?", "Who founded Zarnovia?"]
    res = invoke("audit", "tail", "--store", store)
    assert res.exit_code == 0 and "human_review" in res.output and "pass" in res.output

    out = tmp_path / "out.jsonl"
    res = invoke("audit", "export", str(out), "--store", store)
    assert res.exit_code == 0 and "3 record(s)" in res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["action"] for r in rows} == {"pass", "human_review"} and all(r["tokens"] for r in rows)
    csv_out = tmp_path / "out.csv"
    assert invoke("audit", "export", str(csv_out), "--format", "csv", "--store", store).exit_code == 0
    assert csv_out.read_text().count("\n") >= 4

    res = invoke("audit", "purge", "--days", "1", "--store", store)
    assert res.exit_code == 0 and "0 record(s)" in res.output


def test_ask_rejects_a_bad_policy_before_loading_a_model(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\nrules:\n  - name: r\n    when: {stat: max_eu, op: '>', value: 2}\n    action: explode\n")
    res = invoke("ask", "hi", "--policy", str(bad), "--store", str(tmp_path / "a.db"))
    assert res.exit_code == 2 and "explode" in res.output
    res = invoke("ask", "hi", "--store", str(tmp_path / "no" / "such" / "dir" / "a.db"))
    assert res.exit_code == 2 and "a.db" in res.output
    res = invoke("ask", "  ")
    assert res.exit_code == 2 and "prompt is empty" in res.output


# -- score: where the quadrant thresholds come from --------------------------------------------
ANSWER = ScriptedAnswer(
    ["The", " capital", " is", " Paris", "."],
    [[9.0, 1.0, 0.5], [3.0, 2.5, 0.1], [12.0, 0.5, 0.4], [1.2, 1.1, 1.0], [6.0, 5.0, 2.0]],
)
# The JSON keys `score --json` printed before profiles were used: all must stay.
SCORE_KEYS = {"model", "prompt", "answer", "reliability", "reliability_mean", "finish_reason", "k", "evidence", "top_n"}
SCORE_KEYS |= {"thresholds", "tokens", "timings", "prompt_tokens"}


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, str]]:
    """Replace model loading by a scripted backend named after --model; records each load."""
    calls: list[tuple[str, int, str]] = []
    monkeypatch.setattr(_common, "load_backend", scripted_loader(ANSWER, calls))
    # Wide consoles: rich would otherwise fold long temporary paths across lines.
    monkeypatch.setattr(_common, "out", Console(width=1000))
    monkeypatch.setattr(_common, "err", Console(width=1000, stderr=True))
    return calls


def make_profile(model: str = "fake", k: int = 2, evidence: str = "clamped") -> ModelProfile:
    rng = random.Random(0)
    answers = [
        ScriptedAnswer([f"w{i}" for i in range(6)], [[rng.uniform(0, 12) for _ in range(3)] for _ in range(6)]) for _ in range(10)
    ]
    backend = ScriptedBackend(answers, k=k, evidence=evidence, model_name=model)  # type: ignore[arg-type]
    return calibrate(backend, [f"question {i}?" for i in range(10)])


def score_json(*args: str) -> dict[str, Any]:
    res = invoke("score", "What is the capital of France?", "--model", "fake", "--json", *args)
    assert res.exit_code == 0, res.output
    data: dict[str, Any] = json.loads(res.stdout)
    assert set(data) >= SCORE_KEYS
    return data


def answer_median() -> QuadrantThresholds:
    tokens = CliBackend([ANSWER]).generate("q").tokens
    return QuadrantThresholds.from_quantile([t.au for t in tokens], [t.eu for t in tokens], 0.5)


def test_score_uses_the_saved_profile_of_the_model(tmp_path: Path, loads: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    profile = make_profile()
    path = profile.save(profile_path("fake", 2, "clamped", tmp_path))
    expected = profile.quadrant_thresholds(0.5, 0.5)
    median = answer_median()
    assert (expected.au, expected.eu) != (median.au, median.eu)  # otherwise the test could not tell them apart

    data = score_json("--cache-dir", str(tmp_path))
    th = data["thresholds"]
    assert (th["au"], th["eu"]) == (expected.au, expected.eu)
    assert th["source"].startswith(f"profile {path}") and "uncalibrated" not in th["source"]
    assert data["profile"] == str(path)
    tokens = CliBackend([ANSWER]).generate("q").tokens
    assert [t["quadrant"] for t in data["tokens"]] == [expected.classify(t.au, t.eu).value for t in tokens]
    reliability = CliBackend([ANSWER]).generate("q").score.reliability
    assert data["reliability_percentile"] == pytest.approx(100 * profile.percentile("reliability", reliability))

    res = invoke("score", "What is the capital of France?", "--model", "fake", "--cache-dir", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert f"AU > {expected.au:.4f}, EU > {expected.eu:.4f} (profile {path}" in res.output
    assert f"(percentile {data['reliability_percentile']:.0f} of the model's profile)" in res.output

    # The quantiles are the default policy's quadrant settings, not a constant 0.5.
    from logtoku_guard.decision import policy as policy_module

    skewed = Policy.from_dict({"name": "default", "quadrants": {"au_quantile": 0.9, "eu_quantile": 0.2}})
    monkeypatch.setattr(policy_module, "default_policy", lambda: skewed)
    th = score_json("--cache-dir", str(tmp_path))["thresholds"]
    assert (th["au"], th["eu"]) == (profile.quadrant_thresholds(0.9, 0.2).au, profile.quadrant_thresholds(0.9, 0.2).eu)
    assert "AU q0.9, EU q0.2" in th["source"]

    # Another K or evidence mode has its own profile: none saved for it, so uncalibrated.
    assert "uncalibrated" in score_json("--cache-dir", str(tmp_path), "--top-k", "3")["thresholds"]["source"]
    assert "uncalibrated" in score_json("--cache-dir", str(tmp_path), "--evidence", "raw")["thresholds"]["source"]


def test_score_explicit_profile_path(tmp_path: Path, loads: list[Any]) -> None:
    profile = make_profile()
    path = profile.save(tmp_path / "elsewhere" / "mine.json")
    data = score_json("--cache-dir", str(tmp_path / "empty-cache"), "--profile", str(path))
    expected = profile.quadrant_thresholds()
    assert (data["thresholds"]["au"], data["thresholds"]["eu"]) == (expected.au, expected.eu)
    assert data["profile"] == str(path) and str(path) in data["thresholds"]["source"]


def test_score_command_line_thresholds_win_over_the_profile(tmp_path: Path, loads: list[Any]) -> None:
    path = make_profile().save(profile_path("fake", 2, "clamped", tmp_path))
    for extra in ([], ["--profile", str(path)]):
        data = score_json("--cache-dir", str(tmp_path), "--au-threshold", "0.3", "--eu-threshold", "0.2", *extra)
        assert data["thresholds"] == {"au": 0.3, "eu": 0.2, "source": "command line"}
        assert data["profile"] is None
        tokens = CliBackend([ANSWER]).generate("q").tokens
        assert [t["quadrant"] for t in data["tokens"]] == [
            QuadrantThresholds(0.3, 0.2).classify(t.au, t.eu).value for t in tokens
        ]
    loads.clear()
    res = invoke("score", "hi", "--model", "fake", "--cache-dir", str(tmp_path), "--au-threshold", "0.3")
    assert res.exit_code == 2 and "--eu-threshold" in res.output and loads == []


def test_score_without_a_profile_is_uncalibrated(tmp_path: Path, loads: list[Any]) -> None:
    data = score_json("--cache-dir", str(tmp_path))
    median = answer_median()
    assert data["thresholds"] == {"au": median.au, "eu": median.eu, "source": "median of this answer (uncalibrated)"}
    assert data["reliability_percentile"] is None
    assert data["profile"] is None
    assert not (tmp_path / "profiles").exists()  # score never calibrates
    res = invoke("score", "What is the capital of France?", "--model", "fake", "--cache-dir", str(tmp_path))
    assert res.exit_code == 0 and "(median of this answer (uncalibrated))" in res.output


def test_score_bad_profile_is_a_clear_error(tmp_path: Path, loads: list[Any]) -> None:
    def fails(*args: str) -> str:
        res = invoke("score", "What is the capital of France?", "--model", "fake", "--cache-dir", str(tmp_path), *args)
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output and not isinstance(res.exception, LogTokUError)
        return " ".join(res.output.split())

    missing = tmp_path / "no" / "such.json"
    msg = fails("--profile", str(missing))
    assert f"--profile '{missing}' does not exist" in msg and "logtoku-guard calibrate --model fake --top-k 2" in msg
    assert loads == []  # failed before loading the model

    other = make_profile(model="other-model").save(tmp_path / "other.json")
    msg = fails("--profile", str(other))
    assert str(other) in msg and "'other-model'" in msg and "'fake'" in msg and "logtoku-guard calibrate --model fake" in msg
    wrong_k = make_profile(k=3).save(tmp_path / "k3.json")
    assert "k=3" in fails("--profile", str(wrong_k))

    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    msg = fails("--profile", str(garbage))
    assert f"--profile '{garbage}' is not a model profile" in msg and "calibrate" in msg

    broken = profile_path("fake", 2, "clamped", tmp_path)
    broken.parent.mkdir(parents=True)
    broken.write_text("[]")
    msg = fails()
    assert str(broken) in msg and "remake it with" in msg


def test_ask_checks_an_explicit_profile_before_loading_a_model(tmp_path: Path, loads: list[Any]) -> None:
    missing = tmp_path / "none.json"
    res = invoke("ask", "hi", "--profile", str(missing), "--store", str(tmp_path / "a.db"))
    assert res.exit_code == 2 and str(missing) in " ".join(res.output.split()) and loads == []
    other = make_profile(model="other-model").save(tmp_path / "other.json")
    res = invoke("ask", "hi", "--model", "fake", "--profile", str(other), "--store", str(tmp_path / "a.db"))
    assert res.exit_code == 2 and "'other-model'" in res.output and str(other) in res.output


def test_ask_reports_the_reliability_percentile_of_the_profile(tmp_path: Path, loads: list[Any]) -> None:
    profile = make_profile()
    path = profile.save(tmp_path / "p.json")
    res = invoke("ask", "hi", "--model", "fake", "--profile", str(path), "--store", str(tmp_path / "a.db"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    reliability = CliBackend([ANSWER]).generate("q").score.reliability
    assert data["reliability_percentile"] == pytest.approx(100 * profile.percentile("reliability", reliability))
    res = invoke("ask", "hi", "--model", "fake", "--profile", str(path), "--store", str(tmp_path / "a.db"))
    assert res.exit_code == 0 and f"(percentile {data['reliability_percentile']:.0f} of the model's profile)" in res.output


# -- the --json objects are the library's payloads ----------------------------------------------
TOKEN_KEYS = {"index", "token", "id", "au", "eu", "quadrant", "logprob", "entropy", "top_logits"}


def test_score_json_is_the_generation_payload_plus_the_profile_keys(tmp_path: Path, loads: list[Any]) -> None:
    from logtoku_guard.wire.payloads import GenerationPayload

    data = score_json("--cache-dir", str(tmp_path))
    assert set(data) == set(GenerationPayload.__annotations__) | {"profile", "reliability_percentile"}
    assert [set(t) for t in data["tokens"]] == [TOKEN_KEYS] * 5
    assert [t["index"] for t in data["tokens"]] == [0, 1, 2, 3, 4]


def test_ask_json_is_the_result_payload_plus_the_percentile(tmp_path: Path, loads: list[Any]) -> None:
    from logtoku_guard.wire.payloads import ResultPayload

    path = make_profile().save(tmp_path / "p.json")
    res = invoke("ask", "hi", "--model", "fake", "--profile", str(path), "--store", str(tmp_path / "a.db"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    documented = {"answer", "action", "reason", "rule", "reliability", "attempts", "review_id", "trace_id", "stopped_early"}
    documented |= {"model", "policy", "checks", "stats", "tokens", "timings", "draft", "route", "reliability_percentile"}
    assert set(data) == set(ResultPayload.__annotations__) | {"reliability_percentile"} >= documented
    assert set(data["policy"]) == {"name", "version"} and data["draft"] == "The capital is Paris."
    assert [step["attempt"] for step in data["route"]] == list(range(1, data["attempts"] + 1))
    with AuditStore(tmp_path / "a.db") as audit:
        record = audit.get(data["trace_id"])
    assert record.answer == data["draft"] and record.stats == data["stats"]


def test_help_starts_without_heavy_imports() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from typer.testing import CliRunner; from logtoku_guard.cli import app; "
        "res = CliRunner().invoke(app, ['--help']); assert res.exit_code == 0, res.output; "
        "print(sorted(m for m in ('torch', 'transformers', 'sqlalchemy', 'matplotlib', 'numpy') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"
    res = subprocess.run([sys.executable, "-m", "logtoku_guard.cli", "--help"], capture_output=True, text=True, check=False)
    assert res.returncode == 0 and "review" in res.stdout and "eval" in res.stdout


def test_calibrate_with_labels_prints_what_the_default_threshold_flags(
    tmp_path: Path, loads: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard fit on --labels keeps its out-of-fold scores by label; calibrate prints the default
    policy's threshold in the new profile and the share of correct and incorrect answers it flags."""
    shaky = ScriptedAnswer(["Some", " body"], [[1.2, 1.1, 1.0], [1.0, 0.9, 0.8]])

    def answer(messages: Any) -> ScriptedAnswer:
        return ANSWER if "good" in messages[-1].content else shaky

    monkeypatch.setattr(_common, "load_backend", scripted_loader(answer))
    labels = tmp_path / "my[bold]labels.jsonl"  # a file name is shown as written, never as console markup
    rows = [{"question": f"{'good' if i % 2 else 'odd'} question {i}?", "correct": bool(i % 2)} for i in range(30)]
    labels.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(r["question"] for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "profile.json"
    res = invoke("calibrate", "--model", "fake", "--labels", str(labels), "--prompts", str(prompts), "--out", str(out))
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("default policy: retrieve when guard_score <"))
    assert "correct 0%" in line and "incorrect 100%" in line, line
    assert "default policy threshold: passes at least 80% of correct answers at 90% confidence: guaranteed" in res.output
    guard = ModelProfile.load(out).guard
    assert guard is not None and set(guard.reference_scores) == {"correct", "incorrect"}
    assert "guard score: logistic regression on labels my[bold]labels.jsonl" in res.output


def test_ask_text_shows_the_guard_score_and_the_threshold_that_decided(tmp_path: Path, loads: list[Any]) -> None:
    path = make_profile().save(tmp_path / "p.json")
    res = invoke("ask", "hi", "--model", "fake", "--profile", str(path), "--store", str(tmp_path / "a.db"))
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("Guard score:"))
    # no fitted guard in this profile: the default rule fell back to a quantile of reliability, and fired
    assert line.startswith("Guard score: - (the profile has no fitted guard); reliability ") and "(q0.796 of the profile)" in line
    lenient = tmp_path / "lenient.json"
    rule = {"name": "hopeless", "when": {"stat": "reliability", "op": "<", "value": -100.0}, "action": "abstain"}
    lenient.write_text(json.dumps({"name": "lenient", "rules": [rule], "default_action": "pass"}))
    res = invoke(
        "ask", "hi", "--model", "fake", "--profile", str(path), "--store", str(tmp_path / "a.db"), "--policy", str(lenient)
    )
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("Guard score:"))
    assert line.endswith("no rule fired (hopeless: reliability < -100.0)"), line
