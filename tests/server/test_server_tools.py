"""Tool calls and structured output through ``logtoku-guard serve`` (the real server on 127.0.0.1):
constrained calls and JSON from the tiny random model, scores per argument, streaming, history, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")

from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend  # noqa: E402
from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402

TRANSFER = {
    "type": "function",
    "function": {
        "name": "transfer",
        "description": "Send money.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "integer", "minimum": 0, "maximum": 999},
                "to": {"type": "string", "maxLength": 8},
            },
            "required": ["amount", "to"],
        },
    },
}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Send 5 dollars to Bob."}]
STATS = {"tokens", "mean_au", "mean_eu", "max_au", "max_eu", "logprob"}


@pytest.fixture(scope="module")
def tiny_server(tiny_tokenizer: Any) -> Any:
    """The tiny random model behind the real server (one per module: it is only read)."""
    from support.tiny import make_model

    from logtoku_guard.backends.transformers import TransformersBackend

    model = make_model(tiny_tokenizer, max_positions=1024)  # room for the tools' prompt
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    with BackgroundServer(build_app(backend)) as srv:
        yield srv


def _events(text: str) -> list[Any]:
    lines = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(e) for e in lines[:-1]]


def _post(srv: Any, **body: Any) -> Any:
    body.setdefault("messages", ASK)
    return httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=120)


def _check_call(choice: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] in names
    arguments = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "transfer":
        assert isinstance(arguments["amount"], int) and isinstance(arguments["to"], str) and len(arguments["to"]) <= 8
    (scored,) = choice["logtoku"]["tool_calls"]
    assert (scored["id"], scored["name"]) == (call["id"], call["function"]["name"])
    assert set(scored["arguments"]) == set(arguments)
    for stats in scored["arguments"].values():
        assert set(stats) == STATS and stats["tokens"] >= 1 and stats["max_eu"] >= stats["mean_eu"] >= 0
    return arguments


# -- constrained answers from the tiny random model -------------------------------------------------
@pytest.mark.parametrize(
    ("choice", "names"),
    [("required", ("transfer", "ping")), ({"type": "function", "function": {"name": "transfer"}}, ("transfer",))],
)
def test_a_forced_choice_returns_a_valid_scored_call(tiny_server: Any, choice: Any, names: tuple[str, ...]) -> None:
    r = _post(tiny_server, tools=[TRANSFER, PING], tool_choice=choice, max_tokens=120, temperature=0, parallel_tool_calls=True)
    assert r.status_code == 200, r.text
    _check_call(r.json()["choices"][0], names)


def test_json_schema_answers_with_valid_json(tiny_server: Any) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}}, "required": ["ok", "n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}}
    r = _post(tiny_server, response_format=fmt, max_tokens=60, temperature=0)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    value = json.loads(choice["message"]["content"])
    assert isinstance(value["ok"], bool) and value["n"] in (1, 2, 3)
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"] and "tool_calls" not in choice["logtoku"]
    obj = _post(tiny_server, response_format={"type": "json_object"}, max_tokens=8, temperature=0).json()
    assert obj["choices"][0]["message"]["content"].startswith("{")  # an object (the random model need not close it)


def test_a_streamed_call_comes_whole_in_one_delta_with_the_scores_last(tiny_server: Any) -> None:
    body = {"tools": [TRANSFER], "tool_choice": "required", "max_tokens": 120, "temperature": 0}
    whole = _post(tiny_server, **body).json()["choices"][0]
    events = _events(_post(tiny_server, stream=True, **body).text)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == ""  # nothing of the call leaks as content
    (calls,) = [d["tool_calls"] for d in deltas if d.get("tool_calls")]
    (call,) = calls
    expected = whole["message"]["tool_calls"][0]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == expected["function"]  # greedy: the same call as the whole answer
    last = events[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["logtoku"]["tool_calls"][0]["id"] == call["id"]
    assert last["logtoku"]["tool_calls"][0]["arguments"] == whole["logtoku"]["tool_calls"][0]["arguments"]


def test_tool_choice_none_and_no_tools_answer_in_prose(tiny_server: Any) -> None:
    free = _post(tiny_server, max_tokens=8, temperature=0).json()["choices"][0]
    none = _post(tiny_server, tools=[TRANSFER], tool_choice="none", max_tokens=8, temperature=0).json()["choices"][0]
    assert none["message"] == free["message"] and "tool_calls" not in none["message"]


# -- prose then a call (auto), history, the guard: a scripted backend -------------------------------
CALL_PIECES = [  # prose, then a call whose amount is an unsure token
    "Let",
    " me",
    " check.",
    " <",
    "tool",
    "_call>",
    '{"name": "transfer", "arguments": {"amount": ',
    "5",
    ', "to": "',
    "Bob",
    '"}}',
    "</tool_call>",
]


def _scripted(pieces: list[str] = CALL_PIECES) -> ScriptedBackend:
    rows = [[9.0, 1.0]] * len(pieces)
    if len(pieces) > 7:
        rows[7] = [2.0, 1.9]  # the amount: an unsure token
    return ScriptedBackend(lambda messages: ScriptedAnswer(pieces, rows))


def test_auto_prose_then_a_call_streams_the_prose_and_holds_the_tag() -> None:
    backend = _scripted()
    with BackgroundServer(build_app(backend)) as srv:
        whole = _post(srv, tools=[TRANSFER]).json()["choices"][0]
        events = _events(_post(srv, tools=[TRANSFER], stream=True).text)
        plain = _post(srv, tools=[TRANSFER], stream=True, logprobs=True).text
    assert whole["message"]["content"] == "Let me check." and whole["finish_reason"] == "tool_calls"
    assert json.loads(whole["message"]["tool_calls"][0]["function"]["arguments"]) == {"amount": 5, "to": "Bob"}
    amount = whole["logtoku"]["tool_calls"][0]["arguments"]["amount"]
    assert amount["tokens"] == 1 and amount["max_eu"] > whole["logtoku"]["tool_calls"][0]["arguments"]["to"]["max_eu"]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check. "  # the '<' held, never sent
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if d.get("tool_calls")] == ["transfer"]
    with_logprobs = [e["choices"][0] for e in _events(plain) if e["choices"] and e["choices"][0].get("logprobs")]
    assert len(with_logprobs) == len(CALL_PIECES)  # every token's logprobs, call tokens included


def test_a_cut_call_is_returned_as_content() -> None:
    pieces = CALL_PIECES[:8]
    with BackgroundServer(build_app(_scripted(pieces))) as srv:
        whole = _post(srv, tools=[TRANSFER]).json()["choices"][0]
        events = _events(_post(srv, tools=[TRANSFER], stream=True).text)
    assert whole["message"]["content"] == "".join(pieces) and "tool_calls" not in whole["message"]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == "".join(pieces)


def test_a_call_cut_before_its_closing_tag_is_content_with_finish_reason_length() -> None:
    """The call's JSON is whole but max_tokens cut the closing tag (which parses as a call): the answer was cut,
    so it is content."""
    script = CALL_PIECES
    pieces = script[:-1]  # what max_tokens lets through: no closing tag
    with BackgroundServer(build_app(_scripted(script))) as srv:
        whole = _post(srv, tools=[TRANSFER], max_tokens=len(pieces)).json()["choices"][0]
        events = _events(_post(srv, tools=[TRANSFER], max_tokens=len(pieces), stream=True).text)
    assert whole["message"]["content"] == "".join(pieces) and "tool_calls" not in whole["message"]
    assert whole["finish_reason"] == "length" and "tool_calls" not in whole["logtoku"]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == "".join(pieces)
    assert not any(e["choices"] and e["choices"][0]["delta"].get("tool_calls") for e in events)
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0].get("finish_reason")] == [
        "length"
    ]


def test_tool_history_is_rendered_for_the_model() -> None:
    backend = _scripted(["Done", "."])
    call = {"id": "call_1", "type": "function", "function": {"name": "transfer", "arguments": '{"amount": 5, "to": "Bob"}'}}
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sent"},
    ]
    with BackgroundServer(build_app(backend)) as srv:
        r = _post(srv, messages=messages, tools=[TRANSFER])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "Done.", "refusal": None}
    system, _, assistant, result = backend.calls[-1]
    assert system.role == "system" and '"name": "transfer"' in system.content
    assert assistant.content == '<tool_call>[\n{"name": "transfer", "arguments": {"amount": 5, "to": "Bob"}}\n]</tool_call>'
    assert result.role == "user" and result.content == "<tool_response>\nsent\n</tool_response>"


def _policy(action: str) -> Any:
    from logtoku_guard.decision.policy import Policy

    rule = {"name": "any", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": action}
    return Policy.from_dict({"name": f"always-{action}", "rules": [rule]})


def test_the_guard_decides_on_the_whole_answer_call_included() -> None:
    with BackgroundServer(build_app(_scripted(), policy=_policy("warn"))) as srv:
        warned = _post(srv, tools=[TRANSFER]).json()["choices"][0]
        streamed = _events(_post(srv, tools=[TRANSFER], stream=True).text)
    assert warned["logtoku_guard"]["action"] == "warn" and warned["message"]["tool_calls"][0]["function"]["name"] == "transfer"
    assert warned["message"]["content"].startswith("Let me check.") and "<tool_call>" not in warned["message"]["content"]
    assert warned["logtoku"]["tool_calls"][0]["arguments"]["amount"]["tokens"] == 1
    assert any(e["choices"] and e["choices"][0]["delta"].get("tool_calls") for e in streamed)
    with BackgroundServer(build_app(_scripted(), policy=_policy("abstain"))) as srv:
        withheld = _post(srv, tools=[TRANSFER]).json()["choices"][0]
        streamed = _events(_post(srv, tools=[TRANSFER], stream=True).text)
    assert withheld["logtoku_guard"]["action"] == "abstain" and "tool_calls" not in withheld["message"]
    assert withheld["message"]["content"] is None and withheld["message"]["refusal"]  # a refusal, as OpenAI's
    assert withheld["finish_reason"] == "stop" and "logtoku" not in withheld  # nothing of the withheld call
    assert not any(e["choices"] and e["choices"][0]["delta"].get("tool_calls") for e in streamed)
    assert "<tool_call>" not in "".join(e["choices"][0]["delta"].get("content") or "" for e in streamed if e["choices"])


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [TRANSFER], "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "tool_choice", "'rm'"),
        ({"tools": [TRANSFER], "response_format": {"type": "json_object"}}, "response_format", "tool_choice='none'"),
        ({"tools": [TRANSFER, TRANSFER]}, "tools", "unique"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "tools", "object"),
        ({"tools": [PING] * 129}, "tools", "at most 128"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs 'json_schema'"),
        ({"response_format": {"type": "xml"}}, "response_format", "'text', 'json_object' or 'json_schema'"),
        ({"tool_choice": "sometimes"}, "tool_choice", "'none', 'auto' or 'required'"),
        ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, "messages", "call_9"),
        ({"messages": [{"role": "user"}]}, "messages", "content is required"),
    ],
)
def test_bad_tool_fields_are_refused_naming_the_field(body: dict[str, Any], param: str, needle: str) -> None:
    with BackgroundServer(build_app(_scripted())) as srv:
        r = _post(srv, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and needle in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [TRANSFER], "tool_choice": "required"}, "tool_choice"),
        ({"tools": [TRANSFER], "tool_choice": {"type": "function", "function": {"name": "transfer"}}}, "tool_choice"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
            "response_format",
        ),
    ],
)
def test_a_backend_that_cannot_constrain_refuses_before_streaming(body: dict[str, Any], param: str) -> None:
    with BackgroundServer(build_app(_scripted())) as srv:
        for stream in (False, True):
            r = _post(srv, stream=stream, **body)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert (
                error["param"] == param and "ScriptedBackend" in error["message"] and "constrained decoding" in error["message"]
            )


def test_a_schema_the_grammar_cannot_compile_is_a_400(tiny_server: Any) -> None:
    dangling = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/nope"}}}
    r = _post(tiny_server, response_format=dangling, max_tokens=5)
    assert r.status_code == 400 and "does not point to a part of the schema" in r.json()["error"]["message"]
    lookbehind = {"type": "string", "pattern": "(?<=a)b"}  # a regex the grammar engine does not support
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": lookbehind}}
    r = _post(tiny_server, response_format=fmt, max_tokens=5)
    assert r.status_code == 400 and "cannot be compiled into a grammar" in r.json()["error"]["message"]
    events = _events(_post(tiny_server, response_format=fmt, max_tokens=5, stream=True).text)
    assert "cannot be compiled into a grammar" in events[-1]["error"]["message"]


def test_openapi_documents_the_tool_fields(tiny_server: Any) -> None:
    spec = httpx.get(tiny_server.base_url[: -len("/v1")] + "/openapi.json").json()
    schemas = spec["components"]["schemas"]
    request = schemas["ChatCompletionRequest"]["properties"]
    assert {"tools", "tool_choice", "parallel_tool_calls", "response_format"} <= set(request)
    assert "required" in request["tool_choice"]["description"] and "schema" in schemas["JsonSchemaSpec"]["properties"]
    assert "ToolCall" in schemas and "ToolCallScoresPayload" in schemas
    assert "tool_calls" in schemas["ChoiceScoresPayload"]["properties"]


@pytest.mark.slow
def test_the_embedded_model_calls_a_tool_and_answers_json(embedded_backend: Any) -> None:
    with BackgroundServer(build_app(embedded_backend)) as srv:
        r = _post(srv, tools=[TRANSFER], tool_choice="required", max_tokens=60, temperature=0)
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
        fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
        j = _post(
            srv, messages=[{"role": "user", "content": "What is the capital of France?"}], response_format=fmt, max_tokens=30
        )
    assert r.status_code == 200, r.text
    arguments = _check_call(r.json()["choices"][0], ("transfer",))
    assert arguments["amount"] >= 0
    assert isinstance(json.loads(j.json()["choices"][0]["message"]["content"])["city"], str)


# -- the policy's tool_calls rules on served calls ---------------------------------------------------
def _tool_policy(action: str, **reask: Any) -> Any:
    from logtoku_guard.decision.policy import Policy

    unsure = {"tool": "transfer", "argument": "amount", "stat": "max_eu", "op": ">", "value": 0.3}
    section: dict[str, Any] = {"rules": [{"name": "unsure-amount", "when": unsure, "action": action}]}
    if reask:
        section["reask"] = reask
    return Policy.from_dict({"name": f"tools-{action}", "rules": [], "tool_calls": section})


def _call_gone(choice: dict[str, Any], raw: bytes) -> None:
    assert not choice["message"].get("tool_calls") and choice["finish_reason"] == "stop"  # the note is the answer
    assert "logtoku" not in choice and choice.get("logprobs") in (None, {"content": []})  # asked for: no token, not null
    assert b"Bob" not in raw and b'"amount"' not in raw  # nothing of the held call's arguments


@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_call_is_withheld_with_the_policys_message(stream: bool) -> None:
    policy = _tool_policy("refuse")
    with BackgroundServer(build_app(_scripted(), policy=policy)) as srv:
        r = _post(srv, tools=[TRANSFER], logprobs=True, stream=stream)
    if stream:
        events = _events(r.text)
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        choice = {**events[-1]["choices"][0], "message": {"tool_calls": [], "content": content}}
        assert not any(e["choices"] and e["choices"][0]["delta"].get("tool_calls") for e in events)
        assert not any(e["choices"] and (e["choices"][0].get("logprobs") or {}).get("content") for e in events)
    else:
        choice = r.json()["choices"][0]
    _call_gone(choice, r.content)
    (decided,) = choice["logtoku_guard"]["tool_calls"]
    assert decided["action"] == "refuse" and decided["rule"] == "unsure-amount" and decided["name"] == "transfer"
    assert (
        choice["message"]["content"].startswith("Let me check.") and "was refused and did not run" in choice["message"]["content"]
    )


def test_a_call_for_review_is_recorded_and_released_by_the_reviewer(tmp_path: Any) -> None:
    from logtoku_guard.audit import AuditStore

    with (
        AuditStore(tmp_path / "a.db") as store,
        BackgroundServer(build_app(_scripted(), policy=_tool_policy("human_review"), store=store)) as srv,
    ):
        r = _post(srv, tools=[TRANSFER])
        choice = r.json()["choices"][0]
        _call_gone(choice, r.content)
        (decided,) = choice["logtoku_guard"]["tool_calls"]
        review_id = decided["review_id"]
        assert decided["action"] == "human_review" and f"review id {review_id}" in choice["message"]["content"]
        store.approve(review_id, "alice", edited_answer='{"amount": 4, "to": "Bob"}')
        verdict = httpx.get(f"{srv.base_url}/logtoku/reviews/{review_id}", timeout=30).json()
    assert verdict["status"] == "approved" and json.loads(verdict["answer"]) == {"amount": 4, "to": "Bob"}


def test_a_reasked_call_is_asked_again_then_falls_back() -> None:
    asked: list[Any] = []

    def script(messages: Any) -> ScriptedAnswer:
        asked.append(messages)
        return ScriptedAnswer(CALL_PIECES, [[9.0, 1.0]] * 7 + [[2.0, 1.9]] + [[9.0, 1.0]] * (len(CALL_PIECES) - 8))

    policy = _tool_policy("reask", max_attempts=1, fallback="refuse")
    with BackgroundServer(build_app(ScriptedBackend(script), policy=policy)) as srv:
        choice = _post(srv, tools=[TRANSFER]).json()["choices"][0]
    assert len(asked) == 2  # the first answer, then once more after the re-ask
    assert "you were unsure of its arguments" in asked[1][-1].content  # the model was told why
    actions = [(d["attempt"], d["action"]) for d in choice["logtoku_guard"]["tool_calls"]]
    assert actions == [(1, "reask"), (2, "refuse")] and not choice["message"].get("tool_calls")


def test_a_sure_call_runs() -> None:
    sure = ScriptedBackend(lambda m: ScriptedAnswer(CALL_PIECES, [[9.0, 1.0]] * len(CALL_PIECES)))
    with BackgroundServer(build_app(sure, policy=_tool_policy("refuse"))) as srv:
        choice = _post(srv, tools=[TRANSFER]).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == "transfer"
    assert [d["action"] for d in choice["logtoku_guard"]["tool_calls"]] == ["run"]
