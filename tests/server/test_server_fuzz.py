"""Hostile request bodies over a real socket: never a 500, every refusal a 4xx with an OpenAI error body.

The server runs the tiny random model (real decoding, so a value that reaches the sampler, such as
a seed, is really used); its ``max_tokens`` limit is 2 so a body that passes validation answers fast.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.tiny import make_model

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from logtoku_guard.errors import ConfigurationError  # noqa: E402
from logtoku_guard.server import BackgroundServer, ServerSettings, build_app  # noqa: E402
from logtoku_guard.server.wire import Limits  # noqa: E402

BODY_LIMIT = 200_000
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIELDS = (
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "n",
    "best_of",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "echo",
    "suffix",
)
DEEP = "__deeply_nested__"  # replaced by raw JSON nested DEEP_LEVELS[...] deep when the body is written


@pytest.fixture(scope="module")
def server(tiny_tokenizer: Any) -> Any:
    from logtoku_guard.backends.transformers import TransformersBackend

    backend = TransformersBackend("tiny", model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer, max_batch=2)
    settings_ = ServerSettings(max_body_bytes=BODY_LIMIT, limits=Limits(max_tokens=2, default_max_tokens=2))
    with BackgroundServer(build_app(backend, settings=settings_)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


# -- values a hostile client sends ------------------------------------------------------------
NUMERIC = {"max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "best_of", "logprobs", "top_logprobs"}
numbers = st.one_of(
    st.integers(),
    st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**400]),
    st.builds(lambda digits, sign: sign * 10**digits, st.integers(0, 4000), st.sampled_from([1, -1])),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([5e-324, 1e308, -1e308, 0.0, -0.0, 0.5, 1.0]),
)
texts = st.one_of(
    st.text(max_size=30),
    st.text(st.characters(categories=["Cs", "Cc", "Cf", "Zs", "Lo"]), max_size=10),  # lone surrogates, controls
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "日", "\x00", " "]), st.integers(1000, 120_000)),
)
leaves = st.one_of(st.none(), st.booleans(), numbers, texts, st.just(DEEP))
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS) | texts, inner, max_size=4),
    max_leaves=8,
)
roles = st.sampled_from(["system", "user", "assistant", "tool", ""]) | values
parts = st.lists(st.fixed_dictionaries({"type": st.just("text") | values, "text": texts}), max_size=3)
messages = st.lists(
    st.fixed_dictionaries({"role": roles, "content": values | parts | st.just("What is the capital of France?")}), max_size=3
)


@st.composite
def bodies(draw: st.DrawFn, chat: bool) -> bytes:
    """A request body with some fields hostile (or no object at all)."""
    if draw(st.integers(0, 19)) == 0:  # not an object at all
        body: Any = draw(values)
    else:
        body = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "Paris"}
        for field in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True)):
            if field == "messages":
                body[field] = draw(messages | values)
            else:
                body[field] = draw(numbers | numbers | values) if field in NUMERIC else draw(values)
    depth = draw(st.sampled_from([2, 100, 900, 1200, 5000, 100_000]))
    text = json.dumps(body)  # ints of at most 4001 digits: json writes them
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth, 1).encode()


def check_answer(r: Any) -> None:
    """Never a 500; a 4xx is an OpenAI error body; a 200 stream has no failure inside it."""
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert len(err["message"]) < 2000, "an error message must not echo a huge value"
        assert (err["code"] is None or isinstance(err["code"], str)) and isinstance(err["type"], str) and err["type"]
        return
    assert r.status_code == 200
    if r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]") and '"type":"internal_error"' not in r.text, r.text[-500:]
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def post(client: Any, path: str, raw: bytes) -> Any:
    return client.post(path, content=raw, headers={"Content-Type": "application/json"})


# -- the values found by hand, each its own case ----------------------------------------------
def chat_with(field: str, raw: str) -> str:
    """A valid chat body plus ``"field": raw`` (raw JSON text: numbers json.dumps would not write)."""
    return '{"messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (field, raw)  # noqa: UP031


NESTED_5000 = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    ("raw", "param", "needle"),
    [
        (chat_with("temperature", "9" * 400), "temperature", "finite number"),
        (chat_with("top_p", "9" * 400), "top_p", "finite number"),
        (chat_with("temperature", "1e400"), "temperature", "finite number"),
        (chat_with("seed", str(2**64)), "seed", "2**64 - 1"),
        (chat_with("seed", "-1"), "seed", "from 0"),
        (chat_with("stop", NESTED_5000), None, "too deeply"),
        (NESTED_5000, None, "too deeply"),
        (chat_with("best_of", "[" * 900 + "]" * 900), "best_of", "..."),
        (chat_with("stop", '[""]'), "stop", "empty"),
    ],
    ids=[
        "temperature-400-digits",
        "top_p-400-digits",
        "temperature-1e400",
        "seed-2**64",
        "seed-negative",
        "stop-nested-5000",
        "body-nested-5000",
        "best_of-nested-900",
        "stop-empty",
    ],
)
def test_hand_found_values_get_400_with_an_openai_body(client: Any, raw: str, param: str | None, needle: str) -> None:
    r = post(client, "/chat/completions", raw.encode())
    check_answer(r)
    err = r.json()["error"]
    assert r.status_code == 400 and needle in err["message"] and err["param"] == param


def test_the_largest_seed_is_used(client: Any) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "seed": 2**64 - 1, "temperature": 1.0}
    r = client.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text


def test_an_empty_api_key_is_refused_and_never_authenticates() -> None:
    for key in ("", "   ", " padded ", "naïve"):
        with pytest.raises(ConfigurationError, match="--api-key"):
            ServerSettings(api_key=key)


def test_an_unexpected_failure_is_an_openai_500_body(tiny_backend: Any) -> None:
    """The last-resort handler: a failure outside the library's errors still answers in the OpenAI shape."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        msg = "the backend broke"
        raise RuntimeError(msg)

    tiny_backend.generate = broken
    tiny_backend.stream = broken
    with BackgroundServer(build_app(tiny_backend)) as srv:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=60)
        s = httpx.post(f"{srv.base_url}/chat/completions", json={**body, "stream": True}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 500 and err["type"] == "internal_error" and err["code"] is None and "RuntimeError" in err["message"]
    assert s.status_code == 200 and '"type":"internal_error"' in s.text and s.text.rstrip().endswith("data: [DONE]")


# -- the fuzz ---------------------------------------------------------------------------------
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_fuzzed_bodies_never_get_a_500(client: Any, chat: bool) -> None:
    path = "/chat/completions" if chat else "/completions"

    @FUZZ
    @given(raw=bodies(chat))
    @example(raw=chat_with("temperature", "9" * 400).encode())
    @example(raw=chat_with("seed", str(2**64)).encode())
    @example(raw=chat_with("stop", NESTED_5000).encode())
    def check(raw: bytes) -> None:
        check_answer(post(client, path, raw))

    check()


# -- tools, response formats and tool history (issue 33: F1, F3) --------------------------------
schema_keys = st.sampled_from(
    ["type", "properties", "items", "required", "$ref", "$defs", "anyOf", "enum", "maxLength", "pattern"]
)
schemas = st.recursive(
    st.one_of(
        st.sampled_from([{"type": "string"}, {"type": "integer"}, {"$ref": "#"}, {"$ref": "#/$defs/a"}, {"$ref": "http://x/y"}]),
        values,
    ),
    lambda inner: st.dictionaries(schema_keys, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=10,
)
arguments = st.one_of(
    texts,
    st.builds(lambda n: "[" * n + "]" * n, st.sampled_from([10, 70, 900, 2000, 20_000])),
    st.builds(lambda n: '{"a": ' * n + "1" + "}" * n, st.sampled_from([3, 70, 1500])),
    st.just('{"amount": 5}'),
)


@st.composite
def tool_bodies(draw: st.DrawFn) -> bytes:
    """A chat body with hostile tools, tool_choice, response_format and tool-call history."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    if draw(st.booleans()):
        params = draw(st.just({"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]}) | schemas)
        body["tools"] = [
            {"type": "function", "function": {"name": draw(st.sampled_from(["t", "f_1", ""]) | texts), "parameters": params}}
        ]
        body["tool_choice"] = draw(
            st.sampled_from(["auto", "required", "none", {"type": "function", "function": {"name": "t"}}]) | values
        )
    if draw(st.booleans()):
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": draw(schemas)}}
    if draw(st.booleans()):
        call = {"id": "c1", "type": "function", "function": {"name": "t", "arguments": draw(arguments)}}
        body["messages"] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": draw(texts)},
        ]
    return json.dumps(body).encode()


def test_fuzzed_tool_bodies_never_get_a_500(client: Any) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(raw=tool_bodies())
    @example(raw=json.dumps({
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "t", "parameters": {
            "type": "object", "properties": {"child": {"$ref": "#"}, "v": {"type": "integer"}}, "required": ["child"]}}}],
    }).encode())  # fmt: skip
    def check(raw: bytes) -> None:
        check_answer(post(client, "/chat/completions", raw))

    check()
