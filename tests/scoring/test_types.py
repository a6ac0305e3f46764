"""Typed objects: prompt normalisation, decoding options, dynamic temperature, scores, JSON form."""

from __future__ import annotations

import itertools
import json
import math
from types import MappingProxyType
from typing import Any

import pytest

from logtoku_guard.errors import ConfigurationError, InvalidPromptError
from logtoku_guard.scoring.quadrants import QuadrantThresholds
from logtoku_guard.types import (
    ChatMessage,
    DecodingOptions,
    DynamicTemperature,
    Generation,
    ResponseScore,
    Timings,
    TokenScore,
    to_messages,
)
from logtoku_guard.wire.payloads import generation_payload, token_payload

# --------------------------------------------------------------------------- to_messages


def test_to_messages_plain_string() -> None:
    assert to_messages("What is 2+2?") == [ChatMessage("user", "What is 2+2?")]


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_to_messages_empty_string_names_the_value(prompt: str) -> None:
    with pytest.raises(InvalidPromptError) as info:
        to_messages(prompt)
    assert repr(prompt) in str(info.value)
    assert isinstance(info.value, ConfigurationError)


@pytest.mark.parametrize("prompt", [[], (), None, 42])
def test_to_messages_empty_or_wrong_type_names_the_value(prompt: Any) -> None:
    with pytest.raises(InvalidPromptError) as info:
        to_messages(prompt)
    assert repr(prompt) in str(info.value)


def test_to_messages_mappings_accepted() -> None:
    msgs = to_messages(
        [
            {"role": "system", "content": "Be brief."},
            MappingProxyType({"role": "user", "content": "Hi"}),
            ChatMessage("assistant", "Hello"),
            {"role": "user", "content": "Capital of France?", "name": "ignored"},
        ]
    )
    assert msgs == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello"),
        ChatMessage("user", "Capital of France?"),
    ]


@pytest.mark.parametrize("role", ["tool", "User", "", "bot"])
def test_to_messages_bad_role(role: str) -> None:
    with pytest.raises(InvalidPromptError) as info:
        to_messages([{"role": role, "content": "hi"}])
    assert repr(role) in str(info.value)
    with pytest.raises(InvalidPromptError):
        ChatMessage(role, "hi")  # type: ignore[arg-type]


def test_to_messages_bad_content_and_shape() -> None:
    with pytest.raises(InvalidPromptError, match="123"):
        to_messages([{"role": "user", "content": 123}])  # type: ignore[dict-item]
    with pytest.raises(InvalidPromptError, match=r"chat message 1 .*'just text'"):
        to_messages([{"role": "user", "content": "ok"}, "just text"])  # type: ignore[list-item]
    with pytest.raises(InvalidPromptError, match="chat message 0"):
        to_messages([{"content": "no role"}])


def test_to_messages_only_empty_or_system_turns() -> None:
    with pytest.raises(InvalidPromptError, match="empty"):
        to_messages([{"role": "user", "content": "  "}])
    with pytest.raises(InvalidPromptError, match="empty"):
        to_messages([{"role": "system", "content": "You are helpful."}])


def test_to_messages_system_prepended() -> None:
    assert to_messages("Q?", system="Be brief.") == [ChatMessage("system", "Be brief."), ChatMessage("user", "Q?")]
    msgs = to_messages([{"role": "user", "content": "Q?"}], system="S")
    assert [m.role for m in msgs] == ["system", "user"]
    assert msgs[0].content == "S"


def test_to_messages_existing_system_not_replaced() -> None:
    msgs = to_messages([{"role": "system", "content": "Mine"}, {"role": "user", "content": "Q?"}], system="Other")
    assert msgs == [ChatMessage("system", "Mine"), ChatMessage("user", "Q?")]


def test_to_messages_does_not_mutate_input() -> None:
    turns = [{"role": "user", "content": "Q?"}]
    to_messages(turns, system="S")
    assert turns == [{"role": "user", "content": "Q?"}]


# --------------------------------------------------------------------------- DecodingOptions


def test_decoding_defaults() -> None:
    opts = DecodingOptions()
    assert (opts.max_new_tokens, opts.temperature, opts.top_p, opts.seed, opts.stop, opts.dynamic) == (
        256,
        0.0,
        1.0,
        None,
        (),
        None,
    )
    assert opts.sampling is False
    assert DecodingOptions(temperature=0.7).sampling is True
    assert DecodingOptions(dynamic=DynamicTemperature()).sampling is True


def test_decoding_stop_string_becomes_tuple() -> None:
    assert DecodingOptions(stop="\n").stop == ("\n",)
    assert DecodingOptions(stop=["A", "B"]).stop == ("A", "B")  # type: ignore[arg-type]
    assert DecodingOptions(stop=("x",)).stop == ("x",)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_new_tokens", 0),
        ("max_new_tokens", -5),
        ("max_new_tokens", 1.5),
        ("max_new_tokens", True),
        ("max_new_tokens", "10"),
        ("temperature", -0.1),
        ("temperature", math.inf),
        ("temperature", math.nan),
        ("temperature", "0.5"),
        ("top_p", 0),
        ("top_p", 1.01),
        ("top_p", -0.5),
        ("top_p", math.nan),
        ("top_p", "1"),
        ("seed", -1),
        ("seed", 1.5),
        ("seed", True),
        ("seed", "7"),
        ("stop", ("",)),
        ("stop", ("ok", 3)),
        ("stop", ""),
    ],
)
def test_decoding_bad_field_names_the_value(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        DecodingOptions(**{field: value})
    message = str(info.value)
    assert field in message or (field == "stop" and "stop" in message)
    assert repr(value) in message or repr((value,)) in message


def test_decoding_replace_revalidates() -> None:
    opts = DecodingOptions(max_new_tokens=8, stop="\n")
    changed = opts.replace(temperature=0.5)
    assert changed.temperature == 0.5 and changed.max_new_tokens == 8 and changed.stop == ("\n",)
    assert opts.temperature == 0.0
    with pytest.raises(ConfigurationError, match="-1"):
        opts.replace(max_new_tokens=-1)


@pytest.mark.parametrize("value", [None, 5])
def test_decoding_stop_non_iterable_is_configuration_error(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=repr(value)):
        DecodingOptions(stop=value)


def test_decoding_dynamic_must_be_dynamic_temperature() -> None:
    with pytest.raises(ConfigurationError, match=r"0\.5"):
        DecodingOptions(dynamic=0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_decoding_float_fields_reject_bool(field: str) -> None:
    with pytest.raises(ConfigurationError, match="True"):
        DecodingOptions(**{field: True})


# --------------------------------------------------------------------------- DynamicTemperature


def test_dynamic_temperature_endpoints() -> None:
    dt = DynamicTemperature(t_max=1.2, t_min=0.2)
    assert dt.temperature(1.0) == pytest.approx(0.2)
    assert dt.temperature(0.0) == pytest.approx(1.2)
    assert dt.temperature(0.5) == pytest.approx(0.7)
    # out-of-range EU is clamped to [0, 1]
    assert dt.temperature(3.0) == pytest.approx(0.2)
    assert dt.temperature(-1.0) == pytest.approx(1.2)
    defaults = DynamicTemperature()
    assert defaults.temperature(1.0) == pytest.approx(0.1) and defaults.temperature(0.0) == pytest.approx(1.0)


@pytest.mark.parametrize("power", [0.5, 1.0, 2.0, 3.0])
def test_dynamic_temperature_monotone_decreasing(power: float) -> None:
    dt = DynamicTemperature(t_max=1.0, t_min=0.1, power=power)
    grid = [i / 200 for i in range(201)]
    temps = [dt.temperature(e) for e in grid]
    assert all(a > b for a, b in itertools.pairwise(temps))
    assert all(0.1 - 1e-12 <= t <= 1.0 + 1e-12 for t in temps)
    assert dt.temperature(0.5) == pytest.approx(0.1 + 0.9 * 0.5**power)


def test_dynamic_temperature_constant_when_equal() -> None:
    dt = DynamicTemperature(t_max=0.5, t_min=0.5)
    assert {dt.temperature(e) for e in (0.0, 0.3, 1.0)} == {0.5}


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"t_min": 0.0}, "t_min=0.0"),
        ({"t_min": -0.1}, "t_min=-0.1"),
        ({"t_min": 2.0, "t_max": 1.0}, "t_min=2.0"),
        ({"t_max": math.inf}, "t_max=inf"),
        ({"t_min": math.nan}, "t_min=nan"),
        ({"power": 0.0}, "0.0"),
        ({"power": -1.0}, "-1.0"),
        ({"power": math.nan}, "nan"),
        ({"power": math.inf}, "inf"),
    ],
)
def test_dynamic_temperature_validation(kwargs: dict[str, float], needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        DynamicTemperature(**kwargs)
    assert needle in str(info.value)


# --------------------------------------------------------------------------- ResponseScore


def tok(i: int, au: float, eu: float, logprob: float, entropy: float, text: str = "x") -> TokenScore:
    return TokenScore(
        index=i,
        id=100 + i,
        text=text,
        top_logits=(5.0, 3.0),
        top_ids=(100 + i, 7),
        au=au,
        eu=eu,
        logprob=logprob,
        entropy=entropy,
    )


TOKENS = (
    tok(0, 0.5, 0.2, -0.1, 0.3, "Par"),  # u = 0.1
    tok(1, 0.6, 0.5, -1.0, 0.9, "is"),  # u = 0.3
    tok(2, 0.0, 0.1, -0.01, 0.05, "."),  # u = 0.0
)


def test_response_score_from_tokens_top_n_two() -> None:
    s = ResponseScore.from_tokens(TOKENS, top_n=2)
    assert s.reliability == pytest.approx(-0.2)
    assert s.reliability_mean == pytest.approx(-0.4 / 3)
    assert s.probability_reliability == pytest.approx(-0.55)
    assert s.entropy_reliability == pytest.approx(-0.6)
    assert (s.n_tokens, s.top_n) == (3, 2)


def test_response_score_from_tokens_all_tokens_when_few() -> None:
    s = ResponseScore.from_tokens(TOKENS)
    assert s.top_n == 25
    assert s.reliability == pytest.approx(-0.4 / 3)
    assert s.reliability == pytest.approx(s.reliability_mean)
    assert s.probability_reliability == pytest.approx(-1.11 / 3)
    assert s.entropy_reliability == pytest.approx(-1.25 / 3)


def test_response_score_empty_and_nan() -> None:
    empty = ResponseScore.from_tokens(())
    assert math.isnan(empty.reliability) and math.isnan(empty.reliability_mean)
    assert math.isnan(empty.probability_reliability) and math.isnan(empty.entropy_reliability)
    assert empty.n_tokens == 0
    with_nan = ResponseScore.from_tokens((*TOKENS, tok(3, math.nan, 0.3, -0.2, 0.1)), top_n=1)
    assert math.isnan(with_nan.reliability) and math.isnan(with_nan.reliability_mean)
    assert with_nan.probability_reliability == pytest.approx(-1.0)


def test_token_score_uncertainty_and_quadrant() -> None:
    th = QuadrantThresholds(au=0.3, eu=0.3)
    assert TOKENS[0].uncertainty == pytest.approx(0.1)
    assert [t.quadrant(th).value for t in TOKENS] == ["IV", "I", "III"]


# --------------------------------------------------------------------------- Generation.to_dict

GEN_KEYS = {
    "model",
    "prompt",
    "answer",
    "reliability",
    "reliability_mean",
    "finish_reason",
    "k",
    "tokens",
    "timings",
}
TOKEN_KEYS = {"index", "token", "id", "au", "eu", "quadrant", "logprob", "entropy", "top_logits"}  # payloads.TokenPayload


def make_generation(tokens: tuple[TokenScore, ...] = TOKENS, **kw: Any) -> Generation:
    return Generation(
        model="m",
        prompt="Capital of France?",
        text="".join(t.text for t in tokens),
        tokens=tokens,
        finish_reason="stop",
        top_n=2,
        timings=Timings(total_s=0.5, first_token_s=0.1, tokens_per_s=6.0),
        **kw,
    )


def test_generation_to_dict_keys_and_values() -> None:
    th = QuadrantThresholds(au=0.3, eu=0.3, source="test")
    d = generation_payload(make_generation(), th)
    assert set(d) >= GEN_KEYS
    assert d["model"] == "m"
    assert d["prompt"] == "Capital of France?"
    assert d["answer"] == "Paris."
    assert d["reliability"] == pytest.approx(-0.2)
    assert d["reliability_mean"] == pytest.approx(-0.4 / 3)
    assert d["finish_reason"] == "stop"
    assert d["k"] == 2
    assert d["evidence"] == "clamped" and d["top_n"] == 2
    assert d["thresholds"] == {"au": 0.3, "eu": 0.3, "source": "test"}
    assert d["timings"] == {"total_s": 0.5, "first_token_s": 0.1, "tokens_per_s": 6.0}
    assert len(d["tokens"]) == 3
    for t in d["tokens"]:
        assert set(t) == TOKEN_KEYS
    first = d["tokens"][0]
    assert first == {
        "index": 0,
        "token": "Par",
        "id": 100,
        "au": 0.5,
        "eu": 0.2,
        "quadrant": "IV",
        "logprob": -0.1,
        "entropy": 0.3,
        "top_logits": [5.0, 3.0],
    }
    json.dumps(d, allow_nan=False)


def test_generation_to_dict_without_thresholds() -> None:
    d = generation_payload(make_generation())
    assert d["thresholds"] is None
    assert all(t["quadrant"] is None for t in d["tokens"])


def test_generation_to_dict_temperature_key_only_when_set() -> None:
    import dataclasses

    t = dataclasses.replace(TOKENS[0], temperature=0.4)
    assert token_payload(t)["temperature"] == 0.4
    assert "temperature" not in token_payload(TOKENS[0])


def test_generation_to_dict_nan_becomes_none() -> None:
    bad = tok(3, math.nan, 0.4, -math.inf, math.nan, " ?")
    d = generation_payload(make_generation((*TOKENS, bad)))
    assert d["reliability"] is None and d["reliability_mean"] is None
    last = d["tokens"][-1]
    assert last["au"] is None and last["logprob"] is None and last["entropy"] is None
    assert last["eu"] == 0.4
    text = json.dumps(d, allow_nan=False)  # strict JSON: no NaN / Infinity literals
    assert "NaN" not in text and "Infinity" not in text
    empty = generation_payload(make_generation(()))
    assert empty["reliability"] is None and empty["tokens"] == []
    json.dumps(empty, allow_nan=False)


def test_generation_score_words_and_reliability() -> None:
    tokens = (tok(0, 0.2, 0.5, -0.1, 0.1, "Par"), tok(1, 0.4, 0.3, -0.1, 0.1, "is"), tok(2, 0.1, 0.9, -1, 1, " yes"))
    gen = make_generation(tokens)
    assert gen.reliability == gen.score.reliability
    assert gen.score is gen.score  # cached
    words = gen.words()
    assert [w.text for w in words] == ["Paris", "yes"]
    assert (words[0].au, words[0].eu) == (0.4, 0.5)
