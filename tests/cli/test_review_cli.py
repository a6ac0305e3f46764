"""``logtoku-guard review``: console injection, the released answer, OS users, release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import INJECTIONS, make_record, wide_consoles  # noqa: F401 (an autouse fixture)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from logtoku_guard.audit import AuditStore
from logtoku_guard.cli import app
from logtoku_guard.cli.review_commands import os_user

runner = CliRunner()


def invoke(*args: str) -> object:
    return runner.invoke(app, list(args))


@pytest.fixture
def store(tmp_path: Path) -> str:
    path = tmp_path / "audit.db"
    with AuditStore(path) as audit:
        for name, text in INJECTIONS.items():
            audit.record_for_review(make_record(prompt=text, answer=f"answer {text}", reason=f"reason {name} {text}", tokens=[]))
    return str(path)


def _visible(text: str) -> str:
    """How safe_text shows ``text``: controls as escapes, markup literal."""
    from logtoku_guard.cli._common import safe_text

    return safe_text(text).plain


def test_review_list_and_show_print_injected_text_literally(store: str) -> None:
    res = invoke("review", "list", "--store", store)
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\r" not in res.output and "\u202e" not in res.output
    hidden = [chr(0xE0049), "\u00ad", "\u061c", "\u3164", "\u180e", "\u115f"]
    assert not any(ch in res.output for ch in hidden) and "\\U000e0049" in res.output  # shown as escapes
    for text in INJECTIONS.values():
        assert _visible(text)[:60] in res.output
    assert "[/x]" in res.output and "[link=https://evil.example]" in res.output and "\\x1b[2J" in res.output
    for item_id in range(1, len(INJECTIONS) + 1):
        res = invoke("review", "show", str(item_id), "--store", store)
        assert res.exit_code == 0, res.output
        assert "\x1b" not in res.output and "\r" not in res.output
    res = invoke("review", "show", "2", "--store", store)
    assert "Question: Click [link=https://evil.example]here[/link] please" in res.output
    res = invoke("review", "show", "4", "--store", store)
    assert "\\x1b]8;;http://x\\x1b\\link" in res.output


def test_review_names_and_notes_are_printed_literally(store: str) -> None:
    res = invoke("review", "approve", "1", "-r", "[bold]mallory\x1b[8m", "--note", "[/]", "--store", store)
    assert res.exit_code == 0, res.output
    assert "approved by [bold]mallory\\x1b[8m" in res.output and "\x1b" not in res.output
    res = invoke("review", "show", "1", "--store", store)
    assert res.exit_code == 0 and "note: [/]" in res.output and "\x1b" not in res.output


def test_show_prints_exactly_the_answer_approval_releases(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    with AuditStore(path) as audit:
        tokens = audit.record_for_review(make_record(answer="Paris."))
        no_tokens = audit.record_for_review(make_record(answer="From the context: Paris.", tokens=[]))  # LlamaIndex
        mismatch = audit.record_for_review(make_record(answer="Lyon."))  # tokens spell another text
        edited = audit.record_for_review(make_record(answer="Paris."))
        audit.approve(edited.id, "alice", edited_answer="Paris, France.")
        rejected = audit.record_for_review(make_record(answer="Paris."))
        audit.reject(rejected.id, "alice", "no")
    store = str(path)

    res = invoke("review", "show", str(tokens.id), "--store", store)
    assert "Answer (released if approved): Paris." in res.output and "Tokens:   Paris." in res.output
    res = invoke("review", "show", str(no_tokens.id), "--store", store)
    assert "Answer (released if approved): From the context: Paris." in res.output
    assert "Tokens:   unavailable" in res.output
    res = invoke("review", "show", str(mismatch.id), "--store", store)
    assert "released if approved): Lyon." in res.output and "unavailable" in res.output
    res = invoke("review", "show", str(edited.id), "--store", store)
    assert "Answer (released): Paris, France." in res.output and "unavailable" in res.output
    with AuditStore(path) as audit:
        assert audit.review_item(edited.id).final_answer == "Paris, France."
    res = invoke("review", "show", str(rejected.id), "--store", store)
    assert "Answer (rejected, never released): Paris." in res.output and "Tokens" not in res.output


def test_the_os_user_is_recorded_beside_the_reviewer_name_and_claims_can_be_released(store: str) -> None:
    me = os_user()
    res = invoke("review", "claim", "1", "-r", "alice", "--store", store)
    assert res.exit_code == 0 and f"claimed by alice (OS user {me})" in res.output
    res = invoke("review", "release", "1", "-r", "bob", "--store", store)
    assert res.exit_code == 2 and "claimed by 'alice'" in res.output and "--force" in res.output
    res = invoke("review", "release", "1", "-r", "alice", "--store", store)
    assert res.exit_code == 0 and "pending again" in res.output
    res = invoke("review", "release", "1", "-r", "alice", "--store", store)
    assert res.exit_code == 2 and "not claimed" in res.output
    invoke("review", "claim", "1", "-r", "alice", "--store", store)
    assert invoke("review", "release", "1", "-r", "admin", "--force", "--store", store).exit_code == 0
    res = invoke("review", "reject", "1", "-r", "bob", "--note", "wrong", "--store", store)
    assert res.exit_code == 0 and f"rejected by bob (OS user {me})" in res.output
    with AuditStore(store) as audit:
        item = audit.review_item(1)
    assert (item.reviewer, item.reviewer_os_user, item.claimed_os_user) == ("bob", me, me)
    row = json.loads(invoke("review", "list", "--store", store, "--json").output)["items"][0]
    assert {"claimed_os_user", "reviewer_os_user"} <= set(row)


def test_json_output_escapes_what_a_terminal_would_act_on(tmp_path: Path) -> None:
    hostile = "csi \x9b31m red, del \x7f, bidi \u202egnp.exe\u202c, sep \u2028 end, caf\u00e9 \u4e2d"
    path = tmp_path / "audit.db"
    with AuditStore(path) as audit:
        audit.record_for_review(make_record(prompt=hostile, answer=hostile, reason="r", tokens=[]))
    res = invoke("review", "list", "--store", str(path), "--json")
    assert res.exit_code == 0, res.output
    assert not any(c in res.output for c in "\x9b\x7f\u202e\u202c\u2028")
    assert "\\u009b" in res.output and "\\u202e" in res.output and "caf\u00e9 \u4e2d" in res.output  # readable text stays
    assert json.loads(res.output)["items"][0]["prompt"] == hostile  # still the same JSON value


TOO_BIG = str(2**63)  # one past the largest id a database column holds


@pytest.mark.parametrize(
    "command",
    [["show", TOO_BIG], ["claim", TOO_BIG, "-r", "a"], ["release", TOO_BIG, "-r", "a"], ["approve", TOO_BIG, "-r", "a"]],
)
def test_an_id_past_64_bits_is_no_such_item_not_a_traceback(store: str, command: list[str]) -> None:
    res = invoke("review", *command, "--store", store)
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert f"no review item with id {TOO_BIG}" in res.output and "ids are whole numbers from 1 to 2147483647" in res.output
    assert "`logtoku-guard review list`" in res.output and "Traceback" not in res.output


def test_review_errors_name_cli_commands_not_python_calls(store: str) -> None:
    outputs = [
        invoke("review", "show", "999", "--store", store).output,
        (
            invoke("review", "claim", "1", "-r", "alice", "--store", store),
            invoke("review", "claim", "1", "-r", "bob", "--store", store),
        )[1].output,
        invoke("review", "release", "1", "-r", "bob", "--store", store).output,
        (
            invoke("review", "approve", "2", "-r", "bob", "--store", store),
            invoke("review", "approve", "2", "-r", "bob", "--store", store),
        )[1].output,
    ]
    for output in outputs:
        assert "()" not in output and "force=True" not in output and "review_item" not in output, output
    assert "`logtoku-guard review list`" in outputs[0] and "`logtoku-guard review list`" in outputs[1]
    assert "pass --force" in outputs[2]
    assert "`logtoku-guard review show 2`" in outputs[3]


def test_item_ids_and_json_options_have_help_text() -> None:
    for command in ("show", "claim", "release", "approve", "reject"):
        res = invoke("review", command, "--help")
        assert res.exit_code == 0 and "first column of" in res.output, res.output
    assert "Print one JSON object" in invoke("review", "list", "--help").output


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    command=st.sampled_from(["show", "claim", "release", "approve", "reject"]),
    item_id=st.one_of(
        st.integers(min_value=0, max_value=10),
        st.integers(min_value=2**62, max_value=2**80),
        st.integers(min_value=10**30, max_value=10**400),
        st.integers(max_value=-1),
    ),
)
@pytest.mark.slow
def test_any_integer_id_exits_0_or_2_with_a_message_never_a_traceback(store: str, command: str, item_id: int) -> None:
    extra = {"show": [], "reject": ["-r", "x", "--note", "n"]}.get(command, ["-r", "x"])
    res = invoke("review", command, "--store", store, *extra, "--", str(item_id))
    assert res.exit_code in (0, 2), (res.exit_code, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    if res.exit_code == 2:
        assert "error" in res.output.lower(), res.output


@pytest.mark.parametrize(
    "command",
    [
        ["review", "list"],
        ["review", "list", "--json"],
        ["review", "show", "1"],
        ["review", "claim", "1", "-r", "alice"],
        ["review", "release", "1", "-r", "alice"],
        ["review", "approve", "1", "-r", "alice"],
        ["review", "reject", "1", "-r", "alice", "--note", "no"],
        ["audit", "purge", "--days", "1"],
        ["audit", "purge", "--days", "1", "--dry-run"],
    ],
)
def test_commands_on_a_missing_store_exit_2_and_create_nothing(
    tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "missing.db"
    res = invoke(*command, "--store", str(missing))
    assert res.exit_code == 2, res.output
    assert f"no audit store at {missing}" in res.output and "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []
