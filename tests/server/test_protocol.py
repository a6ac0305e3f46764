"""The wire protocol's models (logtoku_guard.wire.openai_protocol): round trips, recorded vLLM bodies, errors, OpenAPI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
from logtoku_guard.server import wire
from logtoku_guard.server.body import json_depth
from logtoku_guard.types import DecodingOptions
from logtoku_guard.wire import openai_protocol as proto

VLLM = Path(__file__).resolve().parents[1] / "data" / "vllm"
HI = [{"role": "user", "content": "hi"}]
ANSWER = ScriptedAnswer(["Paris", " is", " nice"], [[9.0, 7.5, 1.0], [6.0, 5.5, 2.0], [4.0, 3.0, 2.5]])


def scripted(n: int = 4) -> ScriptedBackend:
    return ScriptedBackend([ANSWER] * n, model_name="scripted")


def generation() -> Any:
    return scripted().generate("What is the capital of France?", DecodingOptions(max_new_tokens=3))


def text_of(i: int) -> str:
    return f"token_id:{i}"


# -- round trips ---------------------------------------------------------------------------------
def test_a_chat_response_round_trips_through_json() -> None:
    g = generation()
    req = proto.ChatCompletionRequest.model_validate({"messages": HI, "logprobs": True, "top_logprobs": 2})
    body = wire.chat_response(req, g, g.text, "scripted", text_of)
    raw = body.model_dump_json(exclude_unset=True)
    back = proto.ChatCompletionResponse.model_validate_json(raw)
    assert back == body
    content = back.choices[0].logprobs.content  # type: ignore[union-attr]
    assert [e.token for e in content] == ["Paris", " is", " nice"] and content[0].logtoku is not None
    assert content[0].logtoku["top_ids"] == list(g.tokens[0].top_ids) and content[0].logtoku["au"] == pytest.approx(
        g.tokens[0].au
    )
    assert back.choices[0].logtoku is not None and back.choices[0].logtoku["n_tokens"] == 3
    assert "logtoku_guard" not in json.loads(raw)["choices"][0]  # an unset extra is left out


def test_a_completion_response_and_chunks_round_trip() -> None:
    g = generation()
    req = proto.CompletionRequest.model_validate({"prompt": "Paris", "logprobs": 1})
    body = wire.completion_response(req, g, g.text, "scripted", text_of)
    assert proto.CompletionResponse.model_validate_json(body.model_dump_json(exclude_unset=True)) == body
    lp = body.choices[0].logprobs
    assert lp is not None and lp.text_offset == [0, 5, 8] and all(len(d or {}) == 1 for d in lp.top_logprobs)
    chunk = wire.chat_chunk("c", 1, "m", proto.DeltaMessage(), finish=g)
    data = json.loads(chunk.model_dump_json(exclude_unset=True))
    assert data["choices"][0]["delta"] == {} and data["choices"][0]["finish_reason"] == g.finish_reason
    assert proto.ChatCompletionChunk.model_validate(data) == chunk


def test_the_remote_backend_request_is_a_valid_server_request() -> None:
    httpx = pytest.importorskip("httpx")
    from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend

    seen: list[Any] = []
    g = generation()

    def handler(request: Any) -> Any:
        seen.append(json.loads(request.content))
        req = proto.ChatCompletionRequest.model_validate(seen[-1])  # what our server would parse
        body = wire.chat_response(req, g, g.text, "scripted", text_of)
        return httpx.Response(200, text=body.model_dump_json(exclude_unset=True))

    client = httpx.Client(transport=httpx.MockTransport(handler))
    with OpenAICompatibleBackend("http://x.test/v1", "scripted", client=client) as remote:
        got = remote.generate("hi", DecodingOptions(max_new_tokens=3, seed=2**64 - 1, stop=("\n",)))
    assert seen[0]["seed"] == 2**64 - 1 and seen[0]["stop"] == ["\n"] and "stream_options" not in seen[0]
    assert [t.id for t in got.tokens] == [t.id for t in g.tokens] and got.text == g.text
    assert [t.logprob for t in got.tokens] == pytest.approx([t.logprob for t in g.tokens])  # the true values, from logtoku


def test_the_remote_backend_refuses_a_response_that_is_not_a_chat_completion() -> None:
    httpx = pytest.importorskip("httpx")
    from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend
    from logtoku_guard.errors import RemoteServerError

    for text, needle in (("not json", "not a chat completion"), ('{"id": "x", "choices": []}', "choices")):
        client = httpx.Client(transport=httpx.MockTransport(lambda r, t=text: httpx.Response(200, text=t)))
        with pytest.raises(RemoteServerError, match=needle):
            OpenAICompatibleBackend("http://x.test/v1", "m", client=client).generate("hi")


# -- recorded vLLM bodies ------------------------------------------------------------------------
def test_recorded_vllm_responses_parse_as_the_models() -> None:
    chat = proto.ChatCompletionResponse.model_validate_json((VLLM / "chat_raw_logits.json").read_text())
    choice = chat.choices[0]
    assert choice.message.content == "Paris is" and choice.finish_reason == "length" and chat.usage is not None
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert [[t.logprob for t in e.top_logprobs] for e in choice.logprobs.content] == [[24.125, 17.5], [19.0, 18.75]]
    assert choice.logtoku is None and choice.logprobs.content[0].logtoku is None  # vLLM has no extras
    events = [
        line[len("data: ") :]
        for line in (VLLM / "chat_stream_raw_logits.sse").read_text().splitlines()
        if line.startswith("data: ")
    ]
    chunks = [proto.ChatCompletionChunk.model_validate_json(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 31


# -- request validation --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"messages": []}, "messages", "messages must be a non-empty list, got []"),
        ({"messages": HI, "seed": -1}, "seed", "seed must be an integer from 0 to 2**64 - 1, got -1"),
        ({"messages": HI, "seed": "7"}, "seed", "seed must be an integer, got '7'"),
        ({"messages": HI, "max_tokens": True}, "max_tokens", "max_tokens must be an integer, got True"),
        ({"messages": HI, "top_p": 0}, "top_p", "top_p must be a number > 0 and <= 1, got 0"),
        ({"messages": HI, "temperature": 10**400}, "temperature", "temperature must be a finite number"),
        ({"messages": HI, "stop": 3}, "stop", "stop must be a string or a list, got 3"),
        ({"messages": HI, "stop": ["a", 3]}, "stop", "stop[1] must be a string, got 3"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages",
            "messages[0].content[0].type must be 'text'",
        ),
        ({"messages": [{"role": "user"}]}, "messages", "messages[0].content is required"),
        ({"messages": HI, "stream_options": {"include_usage": "yes"}}, "stream_options", "stream_options.include_usage"),
        ([HI], None, "the request body must be a JSON object"),
    ],
)
def test_validation_errors_name_the_field_and_the_value(body: Any, param: str | None, message: str) -> None:
    with pytest.raises(proto.ValidationError) as info:
        proto.ChatCompletionRequest.model_validate(body)
    got, got_param = proto.describe_errors(info.value.errors())
    assert got.startswith(message) and got_param == param


def test_json_depth_ignores_brackets_inside_strings() -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[{{{"}], "c": "\\"]]]"}') == 3
    assert json_depth(b"[" * 50 + b"]" * 50) == 50
    assert json_depth(b"[" * 5000, stop_above=10) == 11
    assert json_depth(b'"[[["') == 0


# -- the served schema and error bodies ----------------------------------------------------------
@pytest.fixture(scope="module")
def server() -> Any:
    pytest.importorskip("fastapi")
    from logtoku_guard.server import BackgroundServer, ServerSettings, build_app

    app = build_app(scripted(50), settings=ServerSettings(api_key="k", limits=wire.Limits(max_tokens=8)))
    with BackgroundServer(app) as srv:
        yield srv


def test_openapi_documents_both_endpoints_with_their_schemas(server: Any) -> None:
    httpx = pytest.importorskip("httpx")
    root = server.base_url[: -len("/v1")]
    spec = httpx.get(f"{root}/openapi.json").json()  # open without the key, as /health
    paths = spec["paths"]
    for path, request, response in (
        ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletionResponse"),
        ("/v1/completions", "CompletionRequest", "CompletionResponse"),
    ):
        post = paths[path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{request}")
        assert post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{response}")
        assert post["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    schemas = spec["components"]["schemas"]
    seed = next(s for s in schemas["ChatCompletionRequest"]["properties"]["seed"]["anyOf"] if s.get("type") == "integer")
    assert seed["minimum"] == 0 and seed["maximum"] == pytest.approx(2**64 - 1)  # OpenAPI's numbers are floats
    assert "2**64 - 1" in schemas["ChatCompletionRequest"]["properties"]["seed"]["description"]
    assert "logtoku" in schemas["ChatChoice"]["properties"] and "LogTokUToken" in schemas
    assert paths["/v1/models"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ModelList")
    docs = httpx.get(f"{root}/docs")
    assert docs.status_code == 200 and "openapi.json" in docs.text


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "param", "needle"),
    [
        (b'{"messages": [{"role": "user", "content": "hi"}], "seed": "7"}', "application/json", 400, "seed", "an integer"),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "text/plain", 400, None, "Content-Type: application/json"),
        (b"", "application/json", 400, None, "missing"),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}',
            "application/json",
            400,
            "max_tokens",
            "limit of 8",
        ),
        (b'{"messages": [{"role": "user", "content": "hi"}], "model": "gpt-9"}', "application/json", 404, "model", "gpt-9"),
        (b'{"messages": [{"role": "user", "content": "hi"}],}', "application/json", 400, None, "not valid JSON"),
    ],
    ids=["string-seed", "not-json-content-type", "empty-body", "over-max-tokens", "unknown-model", "trailing-comma"],
)
def test_refusals_are_openai_error_bodies(
    server: Any, raw: bytes, content_type: str, status: int, param: Any, needle: str
) -> None:
    httpx = pytest.importorskip("httpx")
    headers = {"Authorization": "Bearer k", "Content-Type": content_type}
    r = httpx.post(f"{server.base_url}/chat/completions", content=raw, headers=headers)
    assert r.status_code == status, r.text
    err = proto.ErrorResponse.model_validate_json(r.text).error
    assert needle in err.message and err.param == param and err.type
    assert err.code == ("model_not_found" if status == 404 else None)  # a string or null, never the status


def test_served_bodies_validate_as_the_models(server: Any) -> None:
    httpx = pytest.importorskip("httpx")
    headers = {"Authorization": "Bearer k"}
    body = {"messages": HI, "max_tokens": 3, "logprobs": True, "top_logprobs": 2}
    r = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=headers)
    assert proto.ChatCompletionResponse.model_validate_json(r.text).choices[0].message.content == "Paris is nice"
    r = httpx.post(f"{server.base_url}/completions", json={"prompt": "x", "max_tokens": 3, "logprobs": 2}, headers=headers)
    assert proto.CompletionResponse.model_validate_json(r.text).choices[0].text == "Paris is nice"
    assert (
        proto.ModelList.model_validate_json(httpx.get(f"{server.base_url}/models", headers=headers).text).data[0].id == "scripted"
    )
