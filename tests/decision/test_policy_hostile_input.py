"""Hostile and careless policy input: bombs, huge files, bad UTF-8, bad templates; NaN semantics; profile validation."""

from __future__ import annotations

import json
import math
import pathlib
import re
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logtoku_guard import ConfigurationError, ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import ModelProfile, build_profile
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.decision.policy_loading import MAX_POLICY_BYTES, MAX_POLICY_DEPTH, MAX_POLICY_NODES
from logtoku_guard.errors import PolicyError
from logtoku_guard.scoring.stats import STAT_NAMES, ResponseStats

YAML_BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
name: [*i]
"""


def _profile() -> ModelProfile:
    answers = [ScriptedAnswer(["t"], [[float(v), 0.0]]) for v in range(1, 21)]
    backend = ScriptedBackend(answers, model_name="m")
    return build_profile([backend.generate("q") for _ in answers], source="test")


# -- files: bounded before and while parsing -------------------------------------------------
def test_a_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    p = tmp_path / "bomb.yaml"
    p.write_text(YAML_BOMB)
    with pytest.raises(PolicyError, match="YAML aliases are not allowed") as info:
        Policy.from_file(p)
    assert "bomb.yaml" in str(info.value) and len(str(info.value)) < 400


def test_a_10_mb_policy_is_refused_by_size_before_it_is_read(tmp_path: Path) -> None:
    p = tmp_path / "huge.json"
    rules = [{"name": f"r{i}", "when": {"stat": "max_eu", "op": ">", "value": 1}, "action": "warn"} for i in range(120_000)]
    p.write_text(json.dumps({"name": "huge", "rules": rules}))
    assert p.stat().st_size > 10_000_000
    with pytest.raises(PolicyError, match=f"over the {MAX_POLICY_BYTES}-byte limit") as info:
        Policy.from_file(p)
    assert "huge.json" in str(info.value) and len(str(info.value)) < 300


def test_node_count_and_depth_are_bounded_in_files_and_dicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: x\nrules: " + "[" * (MAX_POLICY_DEPTH + 5) + "]" * (MAX_POLICY_DEPTH + 5) + "\n")
    with pytest.raises(PolicyError, match="nested more than"):
        Policy.from_file(deep)
    deep_json = tmp_path / "deep.json"
    deep_json.write_text('{"name": "x", "rules": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(PolicyError, match=r"nested more than|over the"):
        Policy.from_file(deep_json)
    with pytest.raises(PolicyError, match=f"more than {MAX_POLICY_NODES} values"):
        Policy.from_dict({"name": "x", "description": [1] * MAX_POLICY_NODES})
    nested: dict = {"stat": "max_eu", "op": ">", "value": 1}
    for _ in range(MAX_POLICY_DEPTH):
        nested = {"not": nested}
    with pytest.raises(PolicyError, match="nested more than"):
        Policy.from_dict({"name": "x", "rules": [{"name": "r", "when": nested, "action": "warn"}]})
    cyclic: dict = {"name": "x"}
    cyclic["rules"] = [cyclic]
    with pytest.raises(PolicyError, match="nested more than"):
        Policy.from_dict(cyclic)
    with pytest.raises(PolicyError, match="must be a mapping"):
        Policy.from_dict(["not", "a", "mapping"])  # type: ignore[arg-type]
    monkeypatch.setattr("logtoku_guard.decision.policy_loading.MAX_POLICY_NODES", 50)
    many = tmp_path / "many.yaml"
    many.write_text("name: x\ndescription: [" + ",".join(["1"] * 60) + "]\n")
    with pytest.raises(PolicyError, match="more than 50 values"):
        Policy.from_file(many)


def test_invalid_utf8_names_the_file_and_the_byte_offset(tmp_path: Path) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"name: caf" + b"\xe9\n")
    with pytest.raises(PolicyError, match=r"latin1\.yaml.*not valid UTF-8.*offset 9") as info:
        Policy.from_file(p)
    assert "save the file as UTF-8" in str(info.value)


def test_error_messages_never_repr_unbounded_input() -> None:
    huge = "x" * 1_000_000
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"name": "p", "colour": huge, "version": ["y"] * 10_000})
    assert len(str(info.value)) < 1000 and "colour" in str(info.value) and "..." in str(info.value)
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"name": "p", "retrieve": {"context_template": huge}})
    assert len(str(info.value)) < 1000
    many_errors = {"name": "p", "rules": [{"name": "r"}] * 5000}
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(many_errors)
    assert len(str(info.value)) < 10_000 and "more error(s)" in str(info.value)


def test_the_duplicate_rule_check_is_linear() -> None:
    rules = [{"name": f"r{i}", "when": {"stat": "max_eu", "op": ">", "value": 1}, "action": "warn"} for i in range(5_000)]
    rules.append(rules[0])
    with pytest.raises(PolicyError, match=r"unique, repeated: \['r0'\]"):
        Policy.from_dict({"name": "p", "rules": rules})


# -- templates are validated when the policy loads -----------------------------------------------
@pytest.mark.parametrize(
    ("section", "value", "needle"),
    [
        ("human_review", {"message": "review {id}"}, "may only use {review_id}"),
        ("human_review", {"message": "review {review_id"}, "not a valid format string"),
        ("human_review", {"message": "review {}"}, "may only use {review_id}"),
        ("human_review", {"message": "review {review_id.real}"}, "may only use {review_id}"),
        ("human_review", {"message": "review {review_id:q}"}, "use {review_id} bare"),
        # F11: a width is a memory bomb (1 GB at load; MemoryError at 4e10): widths are capped at 64
        ("human_review", {"message": "review {review_id:>999999999}"}, "a width and a precision of at most 64"),
        ("human_review", {"message": "review {review_id:>40000000000}"}, "a width and a precision of at most 64"),
        ("human_review", {"message": "review {review_id:{review_id}}"}, "nothing nested"),
        ("tool_calls", {"refuse": {"message": "{tool:>1000000000}"}}, "a width and a precision of at most 64"),
        ("tool_calls", {"reask": {"message": "{reason:^99999999} {tool}"}}, "a width and a precision of at most 64"),
        ("retrieve", {"context_template": "{context} {question} {lang}"}, "may only use {context}, {question}"),
        ("retrieve", {"context_template": "{context}"}, "must contain {question}"),
        ("retrieve", {"context_template": "{context} {question} }"}, "not a valid format string"),
    ],
)
def test_message_templates_are_checked_at_load(section: str, value: dict, needle: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"name": "p", section: value})
    assert needle in str(info.value)


def test_good_templates_still_load() -> None:
    p = Policy.from_dict(
        {
            "name": "p",
            "human_review": {"message": "held {{for review}}: #{review_id:04d}"},
            "retrieve": {"context_template": "C: {context}\nQ: {question} {{literal}}", "timeout_s": 2.5},
        }
    )
    assert p.human_review.message.format(review_id=7) == "held {for review}: #0007"
    assert p.retrieve.prompt("q", ["a", "b"]) == "C: a\n\nb\nQ: q {literal}" and p.retrieve.timeout_s == 2.5
    with pytest.raises(PolicyError, match="timeout_s"):
        Policy.from_dict({"name": "p", "retrieve": {"timeout_s": 0}})


# -- NaN semantics --------------------------------------------------------------------------------
def test_an_empty_answer_never_passes_silently_under_the_default_policy() -> None:
    d = default_policy().decide(ResponseStats.from_tokens([]), _profile())
    assert d.action == "retrieve" and d.rule == "low-guard-score"
    assert "undefined: empty answer" in d.reason and d.checks[0].undefined == "empty answer"


@pytest.mark.parametrize(
    ("stat", "op", "fires"),
    [
        ("reliability", "<", True),
        ("reliability", "<=", True),
        ("reliability", ">", False),
        ("entropy_reliability", "<", True),
        ("max_eu", ">", True),
        ("max_eu", "<", False),
        ("unreliable_share", ">=", True),
        ("first_eu", ">", True),
    ],
)
def test_undefined_statistics_are_the_least_reliable_value(stat: str, op: str, fires: bool) -> None:
    policy = Policy.from_dict(
        {"name": "p", "rules": [{"name": "r", "when": {"stat": stat, "op": op, "value": 0.5}, "action": "warn"}]}
    )
    d = policy.decide(ResponseStats.from_tokens([]))
    assert (d.action == "warn") is fires
    negated = Policy.from_dict(
        {"name": "p", "rules": [{"name": "r", "when": {"not": {"stat": stat, "op": op, "value": 0.5}}, "action": "warn"}]}
    )
    assert (negated.decide(ResponseStats.from_tokens([])).action == "warn") is not fires


def test_raw_mode_nan_token_scores_say_so() -> None:
    # raw evidence: a top logit <= -1 makes AU undefined (NaN) for a non-empty answer
    g = ScriptedBackend([ScriptedAnswer(["x"], [[-2.0, -3.0]])], evidence="raw").generate("q")
    stats = ResponseStats.from_generation(g)
    assert math.isnan(stats.max_au) and stats.undefined_reason("max_au") == "NaN token scores"
    policy = Policy.from_dict(
        {"name": "p", "rules": [{"name": "r", "when": {"stat": "max_au", "op": ">", "value": 9}, "action": "warn"}]}
    )
    d = policy.decide(stats)
    assert d.action == "warn" and "undefined: NaN token scores" in d.reason
    assert ResponseStats.from_tokens([]).undefined_reason("n_tokens") is None


# -- profiles are validated on load ---------------------------------------------------------------
def test_a_profile_with_a_nan_or_unsorted_grid_is_refused_on_load(tmp_path: Path) -> None:
    good = _profile()
    data = json.loads(good.model_dump_json())
    nan_grid = dict(data, stats=dict(data["stats"], reliability=[math.nan] * 101))
    p = tmp_path / "nan.json"
    p.write_text(json.dumps(nan_grid))  # json writes NaN
    with pytest.raises(ValueError, match=r"'reliability' grid is not finite.*re-run `logtoku-guard calibrate"):
        ModelProfile.load(p)
    unsorted = dict(data, token_eu=list(reversed(sorted(data["token_eu"]))))
    unsorted["token_eu"][0] += 1.0  # strictly decreasing somewhere
    p.write_text(json.dumps(unsorted))
    with pytest.raises(ValueError, match="'token_eu' grid is not sorted"):
        ModelProfile.load(p)
    with pytest.raises(ValueError, match="'max_eu' grid has 3 points"):
        ModelProfile.model_validate(dict(data, stats=dict(data["stats"], max_eu=[1.0, 2.0, 3.0])))
    assert ModelProfile.load(good.save(tmp_path / "good.json")) == good


def test_a_statistic_never_defined_in_calibration_is_left_out_and_rules_on_it_refused() -> None:
    from logtoku_guard.guard.guard import Guard

    blanks = [ScriptedAnswer([" "], [[float(v), 0.0]]) for v in range(1, 6)]  # whitespace only: first_eu is NaN
    backend = ScriptedBackend(blanks, model_name="m")
    profile = build_profile([backend.generate("q") for _ in blanks], "t")
    undefined = {"first_eu", "first_max_eu", "word_mean_eu", "guard_score", "reliability_debiased"}
    undefined |= {s for s in STAT_NAMES if s.startswith("prompt_")}  # no prompt scores from a scripted backend
    undefined |= {s for s in STAT_NAMES if s.startswith("claim_")}  # a blank answer asserts nothing
    assert "first_eu" not in profile.stats and set(profile.stats) == set(STAT_NAMES) - undefined
    policy = Policy.from_dict(
        {
            "name": "p",
            "rules": [{"name": "r", "when": {"stat": "first_eu", "op": ">", "value": {"quantile": 0.9}}, "action": "warn"}],
        }
    )
    with pytest.raises(ConfigurationError, match="no statistic 'first_eu'"):
        Guard(ScriptedBackend(blanks, model_name="m"), policy, profile=profile)


def test_quadrant_share_rules_need_a_profile() -> None:
    from logtoku_guard.guard.guard import Guard

    policy = Policy.from_dict(
        {"name": "p", "rules": [{"name": "r", "when": {"stat": "unreliable_share", "op": ">", "value": 0.5}, "action": "warn"}]}
    )
    with pytest.raises(ConfigurationError, match="quadrant thresholds"):
        Guard(ScriptedBackend([]), policy)


# -- keys given twice and typos in fixed names --------------------------------------------------
def test_yaml_key_given_twice_is_refused_with_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: x\nrules:\n  - name: r\n    when: {stat: max_eu, op: '>', value: 0.5}\n    action: pass\n    action: abstain\n"
    )
    with pytest.raises(PolicyError, match=r"'action' is given twice .*lines 5 and 6"):
        Policy.from_file(path)
    top = tmp_path / "top.yaml"
    top.write_text("name: a\nname: b\n")
    with pytest.raises(PolicyError, match=r"'name' is given twice .*lines 1 and 2"):
        Policy.from_file(top)


def test_json_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"name": "x", "fallback": "pass", "fallback": "abstain"}')
    with pytest.raises(PolicyError, match=r"'fallback' is given twice"):
        Policy.from_file(path)


def test_a_typo_in_a_stat_name_gets_the_closest_name_and_the_whole_list() -> None:

    with pytest.raises(PolicyError) as info:
        Policy.from_dict(
            {"name": "x", "rules": [{"name": "r", "when": {"stat": "max_euu", "op": ">", "value": 1}, "action": "pas"}]}
        )
    text = str(info.value)
    assert "'max_euu' is not allowed; did you mean 'max_eu'" in text and "'pas' is not allowed; did you mean 'pass'" in text
    assert "..." not in text and all(name in text for name in STAT_NAMES)


def test_a_validation_message_keeps_the_whole_list_of_allowed_values() -> None:
    from pydantic import BaseModel, ValidationError

    from logtoku_guard.scoring.stats import StatName

    class Model(BaseModel):
        stat: StatName

    with pytest.raises(ValidationError) as info:
        Model(stat="max_euu")
    text = str(PolicyError.from_validation(info.value))
    for name in typing.get_args(StatName):  # the message lists all 25, none cut
        assert f"'{name}'" in text, name
    assert "..." not in text


@given(items=st.lists(st.text(alphabet="abcdefghij_", min_size=1, max_size=40), min_size=1, max_size=300))
def test_a_long_validation_message_is_cut_after_whole_items(items: list[str]) -> None:
    from logtoku_guard.errors import MESSAGE_LIMIT, bounded_message

    msg = "Input should be " + ", ".join(f"'{i}'" for i in items)
    cut = bounded_message(msg)
    assert len(cut) <= MESSAGE_LIMIT + len(" ... and 300 more")
    if len(msg) <= MESSAGE_LIMIT:
        assert cut == msg
    else:
        kept, _, tail = cut.partition(" ...")
        assert msg.startswith(kept) and kept.endswith("'")  # ends after a whole quoted value
        shown = re.findall(r"'([^']*)'", kept)
        assert shown == items[: len(shown)]
        assert tail == (f" and {len(items) - len(shown)} more" if len(shown) < len(items) else "")


def test_a_yaml_merge_key_is_refused_like_a_duplicate_key(tmp_path: pathlib.Path) -> None:
    """F9: ``<<: {default_action: pass}`` beside ``default_action: abstain`` would silently pick one."""
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ndefault_action: abstain\n<<: {default_action: pass}\n")
    with pytest.raises(PolicyError, match="merge keys"):
        Policy.from_file(path)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_number_of_thousands_of_digits_is_a_policy_error_not_a_traceback(tmp_path: pathlib.Path, suffix: str) -> None:
    """F10: Python refuses to read an integer of more than 4300 digits (a ValueError, not a YAML or JSON error)."""
    rule = '{"name": "r", "when": {"stat": "reliability", "op": "<", "value": ' + "9" * 5000 + '}, "action": "abstain"}'
    path = tmp_path / f"p{suffix}"
    path.write_text('{"name": "p", "rules": [' + rule + "]}")
    with pytest.raises(PolicyError, match="digits"):
        Policy.from_file(path)


# -- fuzz: the classes of issue 33 (templates, merge keys, huge numbers) stay closed ------------------
_TEMPLATE_PARTS = st.sampled_from(
    [
        "review ",
        "{review_id}",
        "{review_id:>999999999}",
        "{review_id:04d}",
        "{review_id!r}",
        "{",
        "}",
        "{{",
        "{x}",
        "{review_id:{review_id}}",
    ]
)
_YAML_VALUES = st.one_of(
    st.integers(),
    st.builds(lambda n: int("9" * n), st.integers(1, 3000)),
    st.sampled_from(["__BIG_4301__", "__BIG_5000__"]),  # written unquoted: past Python's 4300-digit limit
    st.text(max_size=20),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    template=st.lists(_TEMPLATE_PARTS, max_size=5).map("".join),
    merge=st.booleans(),
    value=_YAML_VALUES,
)
def test_fuzzed_policy_files_load_or_raise_a_policy_error(
    tmp_path_factory: pytest.TempPathFactory, template: str, merge: bool, value: typing.Any
) -> None:
    import yaml

    folder = tmp_path_factory.mktemp("fuzz")
    rule = {"name": "r", "when": {"stat": "reliability", "op": "<", "value": value}, "action": "human_review"}
    text = yaml.safe_dump({"name": "p", "rules": [rule], "human_review": {"message": template}}, width=10**6)
    for n in (4301, 5000):
        text = text.replace(f"__BIG_{n}__", "9" * n)
    if merge:
        text += "<<: {default_action: pass}\n"
    path = folder / "p.yaml"
    path.write_text(text)
    try:
        policy = Policy.from_file(path)
    except PolicyError as exc:
        assert len(str(exc)) < 5000
        return
    assert not merge
    policy.human_review.message.format(review_id=12345)  # a loaded template is cheap to fill


@pytest.mark.parametrize("raw", ["true", '"0.3"', "0x10", "1:30", "010"])
@pytest.mark.parametrize("section", ["rules", "tool_calls"])
def test_a_threshold_that_is_not_written_as_a_number_is_refused(tmp_path: pathlib.Path, raw: str, section: str) -> None:
    """true, "0.3", 0x10 (YAML 1.1: 16) and 1:30 (YAML 1.1: 90) were quietly read as numbers."""
    if section == "rules":
        text = f"name: p\nrules:\n  - name: r\n    when: {{stat: reliability, op: '<', value: {raw}}}\n    action: abstain\n"
    else:
        when = f"{{tool: t, argument: a, stat: max_eu, op: '>', value: {raw}}}"
        text = f"name: p\ntool_calls:\n  rules:\n    - name: r\n      when: {when}\n      action: refuse\n"
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError, match="a threshold is a number"):
        Policy.from_file(path)
