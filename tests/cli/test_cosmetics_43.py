"""The cosmetic findings of issue 43, each held: a ``{review_id:c}`` template, a 5000-digit width,
duplicate keys, merge keys and aliases in a policy, and a rule name holding ESC or U+202E."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import scripted_loader
from typer.testing import CliRunner

from logtoku_guard import ScriptedAnswer
from logtoku_guard.cli import _common, app
from logtoku_guard.decision.policy import Policy
from logtoku_guard.errors import PolicyError

SURE = ScriptedAnswer(["Paris", "."], [[14.0, 2.0, 1.0]] * 2)


def review_policy(message: str) -> dict[str, Any]:
    return {
        "name": "p",
        "rules": [{"name": "r", "when": {"stat": "n_tokens", "op": ">=", "value": 0}, "action": "human_review"}],
        "human_review": {"message": message},
    }


@pytest.mark.parametrize("spec", ["c", ">5c", "^c"])
def test_a_character_format_of_the_review_id_is_refused(spec: str) -> None:
    with pytest.raises(PolicyError, match="the 'c' format turns the number into a character"):
        Policy.from_dict(review_policy("held: {review_id:" + spec + "}"))
    Policy.from_dict(review_policy("held: {review_id:04d}"))  # a number format is fine


def test_a_5000_digit_width_gets_a_clear_message() -> None:
    width = "9" * 5000
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(review_policy("held: {review_id:>" + width + "}"))
    text = str(info.value)
    assert "a width and a precision of at most 64" in text and "set_int_max_str_digits" not in text


@pytest.mark.parametrize(
    ("suffix", "text", "expected"),
    [
        (".yaml", "name: a\nname: b\nrules: []\n", "the key 'name' is given twice in one mapping (lines 1 and 2)"),
        (".yaml", "base: &b {stat: x}\nname: a\nrules: []\n", None),  # an anchor alone is harmless; aliases are not
        (".yaml", "d: &b {x: 1}\nname: a\nrules: []\nother: *b\n", "YAML aliases are not allowed"),
        (".yaml", "d: &b {x: 1}\nname: a\nrules: []\nother:\n  <<: *b\n", "YAML aliases are not allowed"),
        (".yaml", "name: a\nrules: []\nother:\n  <<: {x: 1}\n", "YAML merge keys (<<, line 4) are not allowed"),
        (".json", '{"name": "a", "name": "b", "rules": []}', "the key 'name' is given twice in one object"),
    ],
)
def test_duplicate_keys_merge_keys_and_aliases_are_named_as_such(
    tmp_path: Path, suffix: str, text: str, expected: str | None
) -> None:
    path = tmp_path / f"policy{suffix}"
    path.write_text(text, encoding="utf-8")
    if expected is None:
        with pytest.raises(PolicyError) as info:  # refused for another reason (the unknown key), never as a number
            Policy.from_file(path)
        assert "holds a number Python cannot read" not in str(info.value)
        return
    with pytest.raises(PolicyError) as info:
        Policy.from_file(path)
    assert expected in str(info.value) and "holds a number Python cannot read" not in str(info.value)


def test_a_huge_integer_in_a_policy_still_gets_the_number_message(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: a\nrules:\n- name: r\n  when: {stat: max_eu, op: '>', value: " + "9" * 5000 + "}\n  action: warn\n")
    with pytest.raises(PolicyError, match="holds a number Python cannot read"):
        Policy.from_file(path)


def test_ask_prints_a_rule_name_with_control_characters_as_escapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setattr(_common, "out", Console(width=1000, color_system=None))
    monkeypatch.setattr(_common, "err", Console(width=1000, color_system=None, stderr=True))
    monkeypatch.setattr(_common, "load_backend", scripted_loader(SURE))
    name = "evil\x1b[2J\u202eeman [bold]x[/bold]"
    policy = tmp_path / "p.json"
    policy.write_text(
        json.dumps(
            {"name": "p", "rules": [{"name": name, "when": {"stat": "n_tokens", "op": ">=", "value": 0}, "action": "warn"}]}
        )
    )
    res = CliRunner().invoke(app, ["ask", "hi?", "--model", "fake", "--policy", str(policy), "--store", str(tmp_path / "a.db")])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\u202e" not in res.stdout
    assert "rule: evil\\x1b[2J\\u202eeman [bold]x[/bold]" in res.stdout  # shown as escapes, markup left literal
