"""A withheld answer on OpenAI's refusal channel, through the real server on 127.0.0.1.

The guard withholds (abstain, human review): a chat answer comes as ``message.refusal`` with
``content: null``, ``finish_reason: "stop"`` (what OpenAI sends with a refusal), ``logprobs``
``{"content": [], "refusal": []}`` when logprobs were asked (never null) and, streamed, as one
``delta.refusal``; the decision stays in ``logtoku_guard`` and, on a whole answer, in the
``x-logtoku-*`` headers. Each shape is checked against the ``openai`` package's own types, and
no byte holds the draft. The remote backend pointed at a guarded server says the answer was withheld.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from logtoku_guard.audit import AuditStore  # noqa: E402
from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend  # noqa: E402
from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402

DRAFT = ["The", " Zorblaxian", " Institute", " was", " founded", " by", " Quintessa", " Velmoraq", "."]
SECRET = (b"Zorblaxian", b"Quintessa", b"Velmoraq", b"founded")
ROWS = [[9.0 - i * 0.1, 8.5, 1.0] for i in range(len(DRAFT))]
ASK = [{"role": "user", "content": "Who founded the Zorblax Institute?"}]


def scripted() -> ScriptedBackend:
    return ScriptedBackend(lambda messages: ScriptedAnswer(DRAFT, ROWS), model_name="scripted")


def policy(action: str) -> Policy:
    rule = {"name": "always", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": action}
    return Policy.from_dict({"name": f"always-{action}", "rules": [rule]})


def events(text: str) -> list[dict[str, Any]]:
    chunks = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


@pytest.fixture(scope="module")
def abstaining() -> Any:
    pol = policy("abstain")
    with BackgroundServer(build_app(scripted(), policy=pol)) as srv:
        yield srv, pol


@pytest.mark.parametrize("logprobs", [True, False])
def test_a_withheld_chat_answer_is_a_refusal(abstaining: Any, logprobs: bool) -> None:
    srv, pol = abstaining
    body: dict[str, Any] = {"messages": ASK, "max_tokens": 16, "logprobs": logprobs}
    if logprobs:
        body["top_logprobs"] = 2
    r = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    for word in SECRET:
        assert word not in r.content, word
    choice = r.json()["choices"][0]
    message = choice["message"]
    assert message["content"] is None and message["refusal"] == pol.abstain.message
    assert "tool_calls" not in message  # nothing but the refusal
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    if logprobs:  # asked for: an object a client can read, holding no token
        assert choice["logprobs"] == {"content": [], "refusal": []}
    else:
        assert choice["logprobs"] is None
    assert choice["logtoku_guard"]["action"] == "abstain" and choice["logtoku_guard"]["withheld"] is True
    assert "logtoku" not in choice
    assert r.headers["x-logtoku-action"] == "abstain" and r.headers["x-logtoku-withheld"] == "true"
    assert r.headers["x-logtoku-rule"] == "always"


def test_a_passed_answer_has_a_null_refusal_and_its_decision_in_the_headers() -> None:
    with BackgroundServer(build_app(scripted(), policy=policy("pass"))) as srv:
        r = httpx.post(srv.base_url + "/chat/completions", json={"messages": ASK, "max_tokens": 16}, timeout=60)
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "".join(DRAFT) and choice["message"]["refusal"] is None
    assert choice["finish_reason"] == "stop"
    assert r.headers["x-logtoku-action"] == "pass" and r.headers["x-logtoku-withheld"] == "false"


def test_an_unguarded_answer_has_no_decision_headers() -> None:
    with BackgroundServer(build_app(scripted())) as srv:
        r = httpx.post(srv.base_url + "/chat/completions", json={"messages": ASK, "max_tokens": 16}, timeout=60)
    assert r.status_code == 200 and not any(h.startswith("x-logtoku") for h in r.headers)


@pytest.mark.parametrize("logprobs", [True, False])
def test_a_withheld_streamed_answer_is_a_refusal_delta(abstaining: Any, logprobs: bool) -> None:
    srv, pol = abstaining
    body = {"messages": ASK, "max_tokens": 16, "stream": True, "logprobs": logprobs, "stream_options": {"include_usage": True}}
    r = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60)
    for word in SECRET:
        assert word not in r.content, word
    got = events(r.text)
    deltas = [c["delta"] for e in got for c in e["choices"]]
    assert deltas[0] == {"role": "assistant"}  # guarded: no content promised before the guard decides
    assert "".join(d.get("refusal") or "" for d in deltas) == pol.abstain.message
    assert all(d.get("content") in (None, "") for d in deltas)
    with_logprobs = [c["logprobs"] for e in got for c in e["choices"] if c.get("logprobs") is not None]
    assert with_logprobs == ([{"content": [], "refusal": []}] if logprobs else [])
    ends = [c for e in got for c in e["choices"] if c.get("finish_reason")]
    assert len(ends) == 1 and ends[0]["finish_reason"] == "stop" and ends[0]["logtoku_guard"]["action"] == "abstain"


def test_the_refusal_parses_as_the_openai_packages_types(abstaining: Any) -> None:
    types = pytest.importorskip("openai.types.chat")
    srv, pol = abstaining
    body = {"messages": ASK, "max_tokens": 16, "logprobs": True}
    whole = types.ChatCompletion.model_validate(httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60).json())
    choice = whole.choices[0]
    assert choice.message.refusal == pol.abstain.message and choice.message.content is None
    assert choice.logprobs is not None and choice.logprobs.content == [] and choice.logprobs.refusal == []
    streamed = httpx.post(srv.base_url + "/chat/completions", json={**body, "stream": True}, timeout=60)
    chunks = [types.ChatCompletionChunk.model_validate(e) for e in events(streamed.text)]
    assert "".join(c.choices[0].delta.refusal or "" for c in chunks if c.choices) == pol.abstain.message


def test_a_review_refusal_names_its_review_id(tmp_path: Path) -> None:
    with (
        AuditStore(tmp_path / "audit.db") as store,
        BackgroundServer(build_app(scripted(), policy=policy("human_review"), store=store)) as srv,
    ):
        r = httpx.post(srv.base_url + "/chat/completions", json={"messages": ASK, "max_tokens": 16}, timeout=60)
    choice = r.json()["choices"][0]
    review_id = choice["logtoku_guard"]["review_id"]
    assert isinstance(review_id, int) and str(review_id) in choice["message"]["refusal"]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "stop"
    assert r.headers["x-logtoku-review-id"] == str(review_id) and r.headers["x-logtoku-action"] == "human_review"
    for word in SECRET:
        assert word not in r.content


@pytest.mark.parametrize("stream", [False, True])
def test_a_withheld_legacy_completion_keeps_content_filter_with_empty_logprobs(abstaining: Any, stream: bool) -> None:
    """The legacy API has no refusal channel: the text is the message, finish_reason content_filter,
    and logprobs (asked for) are empty lists rather than null."""
    srv, pol = abstaining
    body = {"prompt": "Who founded the Zorblax Institute?", "max_tokens": 16, "logprobs": 2, "stream": stream}
    r = httpx.post(srv.base_url + "/completions", json=body, timeout=60)
    for word in SECRET:
        assert word not in r.content
    got = events(r.text) if stream else [r.json()]
    choices = [c for e in got for c in e["choices"]]
    assert "".join(c["text"] for c in choices) == pol.abstain.message
    assert [c["finish_reason"] for c in choices if c.get("finish_reason")] == ["content_filter"]
    lps = [c["logprobs"] for c in choices if c.get("logprobs") is not None]
    assert lps and all(lp["tokens"] == [] and lp["token_logprobs"] == [] for lp in lps)


@pytest.mark.parametrize("stream", [False, True])
def test_the_remote_backend_says_a_guarded_server_withheld_the_answer(abstaining: Any, stream: bool) -> None:
    from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend
    from logtoku_guard.errors import RemoteServerError

    srv, pol = abstaining
    with OpenAICompatibleBackend(srv.base_url, "scripted") as remote, pytest.raises(RemoteServerError) as info:
        if stream:
            with remote.stream("Who founded the Zorblax Institute?") as tokens:
                list(tokens)
        else:
            remote.generate("Who founded the Zorblax Institute?")
    text = str(info.value)
    assert "withheld the answer" in text and "'abstain'" in text and "'always'" in text and pol.abstain.message in text
    assert "must support logprobs" not in text
