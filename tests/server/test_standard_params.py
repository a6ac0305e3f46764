"""Standard chat-completions parameters are honoured or refused, never accepted and ignored.

``logit_bias``, ``frequency_penalty`` and ``presence_penalty`` act on the logits that choose the next
token, on the transformers and llama.cpp backends, while the guard's scores stay those of the raw
logits; a backend that cannot apply them (the scripted one) answers 400 naming the parameter; ``stop``
holds at most 4 strings; the standard fields this server cannot honour are refused by name; error
``code`` is a string or null.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from logtoku_guard.backends.processors import OpenAIPenaltiesLogitsProcessor, penalise_row, request_processors
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.types import DecodingOptions
from logtoku_guard.wire import openai_protocol as proto

HI = [{"role": "user", "content": "hi"}]
ASK = [{"role": "user", "content": "Tell me about the weather in Paris."}]


# -- the request's rules -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "stop holds at most 4 strings"),
        ({"logit_bias": {"abc": 1}}, "logit_bias", "token ids written as strings"),
        ({"logit_bias": {"-3": 1}}, "logit_bias", "token ids written as strings"),
        ({"logit_bias": {"12": 101}}, "logit_bias", "outside -100 to 100"),
        ({"logit_bias": {"12": "x"}}, "logit_bias", "a number"),
        ({"frequency_penalty": 2.5}, "frequency_penalty", "from -2 to 2"),
        ({"presence_penalty": -3}, "presence_penalty", "from -2 to 2"),
        ({"functions": [{"name": "f"}]}, "functions", "send tools"),
        ({"function_call": "auto"}, "function_call", "tool_choice"),
        ({"modalities": ["text", "audio"]}, "modalities", "text only"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "text only"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction", "predicted outputs"),
        ({"web_search_options": {}}, "web_search_options", "web search"),
        ({"reasoning_effort": "low"}, "reasoning_effort", "not a reasoning model"),
        ({"verbosity": "low"}, "verbosity", "verbosity"),
        ({"moderation": {"output": {"mode": "block"}}}, "moderation", "no moderation"),
        ({"store": True}, "store", "does not store"),
        ({"service_tier": "flex"}, "service_tier", "one tier"),
    ],
)
def test_unsupported_or_bad_standard_fields_are_refused_by_name(body: dict[str, Any], param: str, needle: str) -> None:
    with pytest.raises(proto.ValidationError) as info:
        proto.ChatCompletionRequest.model_validate({"messages": HI, **body})
    message, got = proto.describe_errors(info.value.errors())
    assert got == param and needle in message, message


def test_informational_fields_are_accepted() -> None:
    """Fields that do not change the answer (OpenAI's own description) are accepted as they are."""
    req = proto.ChatCompletionRequest.model_validate(
        {
            "messages": HI,
            "user": "u1",
            "safety_identifier": "s",
            "prompt_cache_key": "k",
            "prompt_cache_retention": "24h",
            "prompt_cache_options": {"ttl": "1h"},
            "stream_options": {"include_usage": True, "include_obfuscation": False},
            "metadata": {"a": "b"},
            "store": False,
            "service_tier": "auto",
            "modalities": ["text"],
            "stop": ["a", "b", "c", "d"],
            "logit_bias": {"7": -100, "3": 2.5},
            "frequency_penalty": 0.5,
            "presence_penalty": -0.5,
        }
    )
    assert req.logit_bias_pairs == ((3, 2.5), (7, -100.0)) and len(req.stop_strings) == 4


def test_decoding_options_check_the_logit_parameters() -> None:
    o = DecodingOptions(logit_bias={5: -100, 2: 1}, frequency_penalty=1, presence_penalty=0.5)  # type: ignore[arg-type]
    assert o.logit_bias == ((2, 1.0), (5, -100.0)) and o.logit_params == ("logit_bias", "frequency_penalty", "presence_penalty")
    assert DecodingOptions().logit_params == ()
    for bad in ({"frequency_penalty": 3}, {"presence_penalty": "1"}, {"logit_bias": ((1, 200),)}, {"logit_bias": ((-1, 1),)}):
        with pytest.raises(ConfigurationError):
            DecodingOptions(**bad)


# -- the processors ------------------------------------------------------------------------------
def test_the_penalties_follow_openais_formula_over_the_answer_only() -> None:
    import torch

    prompt = [4, 4, 4]  # not penalised: only the answer's tokens count
    answer = [1, 2, 2, 2]
    scores = torch.zeros(1, 6)
    out = OpenAIPenaltiesLogitsProcessor(0.5, 0.25, len(prompt))(torch.tensor([prompt + answer]), scores)  # type: ignore[arg-type]
    expected = [0.0, -(0.5 + 0.25), -(3 * 0.5 + 0.25), 0.0, 0.0, 0.0]
    assert out[0].tolist() == pytest.approx(expected) and scores.abs().sum() == 0  # the input is left as it is
    options = DecodingOptions(frequency_penalty=0.5, presence_penalty=0.25, logit_bias=((5, -100.0), (0, 3.0)))
    row = penalise_row(np.zeros(6, dtype=np.float32), answer, options)
    assert row.tolist() == pytest.approx([3.0, -0.75, -1.75, 0.0, 0.0, -100.0])
    torch_row = torch.zeros(1, 6)
    ids = torch.tensor([prompt + answer])
    for p in request_processors(options, len(prompt)):
        torch_row = p(ids, torch_row)
    assert torch_row[0].tolist() == pytest.approx(row.tolist())  # both backends' forms agree
    assert request_processors(DecodingOptions(), 3) == []


# -- through the server, on the tiny transformers model ------------------------------------------
@pytest.fixture(scope="module")
def served(tiny_tokenizer: Any) -> Any:
    pytest.importorskip("fastapi")
    from support.served import tiny_served

    from logtoku_guard.server import BackgroundServer, build_app

    backend = tiny_served(tiny_tokenizer)
    with BackgroundServer(build_app(backend)) as srv:
        yield srv, backend


def ask(srv: Any, **body: Any) -> Any:
    httpx = pytest.importorskip("httpx")
    body = {"messages": ASK, "max_tokens": 24, "temperature": 0, "logprobs": True, **body}
    return httpx.post(srv.base_url + "/chat/completions", json=body, timeout=120)


def ids_of(r: Any) -> list[int]:
    assert r.status_code == 200, r.text
    return [e["logtoku"]["id"] for e in r.json()["choices"][0]["logprobs"]["content"]]


def test_logit_bias_bans_the_greedy_first_token_and_the_scores_stay_raw(served: Any) -> None:
    srv, _ = served
    plain = ask(srv)
    first = ids_of(plain)[0]
    banned = ask(srv, logit_bias={str(first): -100})
    got = ids_of(banned)
    assert got[0] != first  # the bias acted
    raw, biased = (r.json()["choices"][0]["logprobs"]["content"][0]["logtoku"] for r in (plain, banned))
    # the first step's logits are the model's own either way: the guard scores what the model believed
    assert biased["top_logits"] == pytest.approx(raw["top_logits"]) and biased["top_ids"] == raw["top_ids"]
    assert (biased["au"], biased["eu"]) == pytest.approx((raw["au"], raw["eu"]))
    forced = ask(srv, logit_bias={str(got[0] + 1): 100})
    assert ids_of(forced)[0] == got[0] + 1  # +100 forces a token


def test_penalties_change_a_repetitive_answer(served: Any) -> None:
    srv, _ = served
    repeat = [{"role": "user", "content": "a a a a a a a a"}]
    plain = ids_of(ask(srv, messages=repeat))
    assert len(set(plain)) < len(plain) - 4  # the tiny random model repeats itself here (greedy: always the same)
    for param in ("frequency_penalty", "presence_penalty"):
        penalised = ids_of(ask(srv, messages=repeat, **{param: 2.0}))
        assert penalised != plain, param
        assert len(set(penalised)) > len(set(plain)), param  # fewer repeats
    assert ids_of(ask(srv, messages=repeat, frequency_penalty=0.0, presence_penalty=0.0)) == plain  # 0: no change


def test_logit_bias_outside_the_vocabulary_is_a_400(served: Any) -> None:
    srv, backend = served
    r = ask(srv, logit_bias={str(backend.vocab_size): 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "logit_bias" and str(backend.vocab_size) in err["message"]
    assert err["code"] is None


# -- refused where the backend cannot apply them -------------------------------------------------
@pytest.mark.parametrize("param", [{"logit_bias": {"1": 5}}, {"frequency_penalty": 1.0}, {"presence_penalty": -1.0}])
def test_a_backend_that_cannot_apply_them_refuses_with_a_400_naming_the_parameter(param: dict[str, Any]) -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
    from logtoku_guard.server import BackgroundServer, build_app

    backend = ScriptedBackend(lambda m: ScriptedAnswer(["a"], [[1.0, 0.5]]), model_name="scripted")
    with BackgroundServer(build_app(backend)) as srv:
        for path, body in (("/chat/completions", {"messages": HI}), ("/completions", {"prompt": "hi"})):
            r = httpx.post(srv.base_url + path, json={**body, **param}, timeout=60)
            err = r.json()["error"]
            (name,) = param
            assert r.status_code == 400 and err["param"] == name and name in err["message"], r.text
            assert err["code"] == "unsupported_parameter" and err["type"] == "invalid_request_error"


def test_the_remote_backend_forwards_them() -> None:
    httpx = pytest.importorskip("httpx")
    from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend

    seen: list[Any] = []

    def handler(request: Any) -> Any:
        seen.append(json.loads(request.content))
        return httpx.Response(400, json={"error": {"message": "stop here", "type": "x", "param": None, "code": None}})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    options = DecodingOptions(logit_bias=((3, -100.0),), frequency_penalty=1.5, presence_penalty=0.5)
    with OpenAICompatibleBackend("http://x.test/v1", "m", client=client) as remote, pytest.raises(Exception, match="stop here"):
        remote.generate("hi", options)
    assert seen[0]["logit_bias"] == {"3": -100.0} and seen[0]["frequency_penalty"] == 1.5 and seen[0]["presence_penalty"] == 0.5
    proto.ChatCompletionRequest.model_validate(seen[0])  # what our server accepts


# -- llama.cpp -----------------------------------------------------------------------------------
def test_llamacpp_applies_logit_bias_and_penalties() -> None:
    from support.served import llamacpp_served

    backend = llamacpp_served(n_ctx=512, max_batch=2)
    try:
        base = DecodingOptions(max_new_tokens=16)
        plain = backend.generate("Repeat the word yes ten times.", base)
        ids = [t.id for t in plain.tokens]
        banned = backend.generate("Repeat the word yes ten times.", base.replace(logit_bias=((ids[0], -100.0),)))
        assert banned.tokens[0].id != ids[0]
        assert banned.tokens[0].top_logits == pytest.approx(plain.tokens[0].top_logits)  # raw logits scored
        penalised = backend.generate("Repeat the word yes ten times.", base.replace(frequency_penalty=2.0))
        assert [t.id for t in penalised.tokens] != ids
        assert len({t.id for t in penalised.tokens}) >= len(set(ids))
    finally:
        backend.close()
