"""The review and audit commands on a store filled by a guard over scripted logits (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from logtoku_guard import AuditStore, Guard, Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.cli import app

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
