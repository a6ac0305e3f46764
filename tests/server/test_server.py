"""``logtoku-guard serve`` end to end: the real server (uvicorn) on 127.0.0.1, a free port, the tiny model."""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend  # noqa: E402
from logtoku_guard.server import BackgroundServer, ServerSettings, build_app  # noqa: E402
from logtoku_guard.types import DecodingOptions  # noqa: E402

KEY = "test-key"
GREEDY = DecodingOptions(max_new_tokens=12)


@pytest.fixture
def server(tiny_backend: Any) -> Any:
    app = build_app(tiny_backend, settings=ServerSettings(api_key=KEY, max_body_bytes=20_000))
    with BackgroundServer(app) as srv:
        yield srv


@pytest.fixture
def client(server: Any) -> Any:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        yield c


def chat(client: Any, **body: Any) -> Any:
    body.setdefault("messages", [{"role": "user", "content": "What is the capital of France?"}])
    return client.post("/chat/completions", json=body)


def test_models_lists_the_served_model(client: Any, tiny_backend: Any) -> None:
    r = client.get("/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == [tiny_backend.model_name]


def test_remote_backend_matches_local_greedy_answer_and_scores(server: Any, tiny_backend: Any) -> None:
    local = tiny_backend.generate("What is the capital of France?", GREEDY)
    with OpenAICompatibleBackend(server.base_url, tiny_backend.model_name, api_key=KEY) as remote:
        got = remote.generate("What is the capital of France?", GREEDY)
    assert got.text == local.text and len(got.tokens) == len(local.tokens) > 0
    assert got.finish_reason == local.finish_reason and got.prompt_tokens == local.prompt_tokens
    for a, b in zip(got.tokens, local.tokens):
        assert (a.id, a.text, a.top_ids) == (b.id, b.text, b.top_ids)
        assert a.au == pytest.approx(b.au, abs=1e-4) and a.eu == pytest.approx(b.eu, abs=1e-4)
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4) and a.entropy == pytest.approx(b.entropy, abs=1e-4)
    assert got.reliability == pytest.approx(local.reliability, abs=1e-4)


def test_remote_stream_and_batch_match_local(server: Any, tiny_backend: Any) -> None:
    local = tiny_backend.generate("Count from one to ten", GREEDY)
    with OpenAICompatibleBackend(server.base_url, tiny_backend.model_name, api_key=KEY) as remote:
        with remote.stream("Count from one to ten", GREEDY) as stream:
            streamed = list(stream)
        assert [t.text for t in streamed] == [t.text for t in local.tokens]
        assert stream.generation.text == local.text
        assert [t.au for t in streamed] == pytest.approx([t.au for t in local.tokens], abs=1e-4)
        batch = remote.batch(["Count from one to ten", "What is the capital of France?"], GREEDY)
    assert batch[0].text == local.text


def test_chat_logprobs_are_openai_log_probabilities_with_raw_logits_in_the_extension(client: Any, tiny_backend: Any) -> None:
    """OpenAI's ``logprob`` is a log-probability: every value <= 0, the alternatives' probabilities sum
    to at most 1, up to 20 of them whatever K is; the raw top-K logits stay in ``logtoku``."""
    local = tiny_backend.generate("What is the capital of France?", GREEDY)
    r = chat(client, max_tokens=12, temperature=0, logprobs=True, top_logprobs=20)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == len(local.tokens)
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": local.text, "refusal": None}
    content = choice["logprobs"]["content"]
    assert len(content) == len(local.tokens)
    for entry, t in zip(content, local.tokens):
        assert set(entry) >= {"token", "logprob", "bytes", "top_logprobs", "logtoku"}
        assert entry["logprob"] == pytest.approx(t.logprob) and entry["logprob"] <= 0
        tops = [e["logprob"] for e in entry["top_logprobs"]]
        assert len(tops) == 20 and all(v <= 0 for v in tops) and sum(math.exp(v) for v in tops) <= 1 + 1e-6
        assert tops == sorted(tops, reverse=True) and tops[0] == pytest.approx(entry["logprob"])  # greedy: chosen = top-1
        assert all(set(e) == {"token", "logprob", "bytes"} for e in entry["top_logprobs"])
        assert entry["logtoku"]["top_logits"] == pytest.approx(list(t.top_logits))  # the raw logits AU/EU are made of
        assert entry["logtoku"]["au"] == pytest.approx(t.au) and entry["logtoku"]["eu"] == pytest.approx(t.eu)
    assert choice["logtoku"]["reliability"] == pytest.approx(local.reliability)
    assert [p["id"] for p in choice["logtoku"]["prompt_scores"]] == [p.id for p in local.prompt_scores]


def test_raw_logits_mode_puts_vllm_raw_logits_in_logprob(tiny_backend: Any) -> None:
    from logtoku_guard.server.wire import Limits

    local = tiny_backend.generate("What is the capital of France?", GREEDY)
    settings = ServerSettings(limits=Limits(logprobs_mode="raw_logits"))
    with BackgroundServer(build_app(tiny_backend, settings=settings)) as srv:
        body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12}
        r = httpx.post(f"{srv.base_url}/chat/completions", json={**body, "temperature": 0, "logprobs": True, "top_logprobs": 3})
        with OpenAICompatibleBackend(srv.base_url, tiny_backend.model_name) as remote:
            got = remote.generate("What is the capital of France?", GREEDY)
    content = r.json()["choices"][0]["logprobs"]["content"]
    for entry, t in zip(content, local.tokens):
        assert entry["logprob"] == pytest.approx(t.top_logits[0])  # greedy: the chosen token's raw logit
        assert [e["logprob"] for e in entry["top_logprobs"]] == pytest.approx(list(t.alt_logits[:3]))
    assert [t.au for t in got.tokens] == pytest.approx([t.au for t in local.tokens], abs=1e-4)


def test_completions_endpoint_shape(client: Any) -> None:
    r = client.post("/completions", json={"prompt": "The capital of France", "max_tokens": 6, "temperature": 0, "logprobs": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert "".join(lp["tokens"]) == choice["text"]
    assert all(isinstance(d, dict) and 1 <= len(d) <= 2 for d in lp["top_logprobs"])


def _events(text: str) -> list[Any]:
    chunks = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


def test_chat_streaming_sse(client: Any, tiny_backend: Any) -> None:
    local = tiny_backend.generate("What is the capital of France?", GREEDY)
    with client.stream(
        "POST",
        "/chat/completions",
        json={
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 12,
            "temperature": 0,
            "stream": True,
            "logprobs": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.read().decode())
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == local.text
    last = [e for e in events if e["choices"]][-1]["choices"][0]
    assert last["finish_reason"] == local.finish_reason and "logtoku" in last
    assert events[-1]["usage"]["completion_tokens"] == len(local.tokens)


def test_completion_streaming(client: Any) -> None:
    r = client.post("/completions", json={"prompt": "Paris", "max_tokens": 5, "temperature": 0, "stream": True})
    events = _events(r.text)
    assert all(e["object"] == "text_completion" for e in events)
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "role"),
        ({"messages": [{"role": "user", "content": "   "}]}, 400, "empty"),
        ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, 404, "gpt-9"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n=2"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
            400,
            "top_logprobs=21 is above 20",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 1}, 400, "logprobs=true"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": 3}, 400, "stop"),
        ({"messages": [{"role": "user", "content": "x" * 30_000}]}, 413, "limit"),
        (  # F3: arguments nested 2000 deep in the history: a 400, never a RecursionError's 500
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 2000 + "]" * 2000}}
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                ]
            },
            400,
            "function.arguments must be a JSON object",
        ),
    ],
)
def test_bad_requests_get_4xx_with_a_message(client: Any, body: Any, status: int, needle: str) -> None:
    r = chat(client, **body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"]
    assert err["code"] == {401: "invalid_api_key", 404: "model_not_found", 413: "request_too_large"}.get(status)  # not the status


def test_bad_json_and_unknown_route(client: Any) -> None:
    r = client.post("/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = client.post("/completions", json={"prompt": ["a", "b"]})
    assert r.status_code == 400 and "one string" in r.json()["error"]["message"]
    r = client.get("/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_api_key_is_enforced(server: Any) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=headers)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    assert httpx.get(f"{server.base_url}/models").status_code == 401
    assert httpx.get(f"{server.base_url[: -len('/v1')]}/health").status_code == 200
    bad = OpenAICompatibleBackend(server.base_url, "tiny", api_key="wrong")
    with pytest.raises(Exception, match="401"):
        bad.generate("hi", GREEDY)


def test_non_loopback_host_needs_allow_flag() -> None:
    from logtoku_guard.errors import ConfigurationError
    from logtoku_guard.server.run import check_host

    assert check_host("127.0.0.1", False) == "127.0.0.1" and check_host("::1", False) == "::1"
    with pytest.raises(ConfigurationError, match="--allow-remote"):
        check_host("0.0.0.0", False)
    assert check_host("0.0.0.0", True) == "0.0.0.0"


def test_policy_guards_each_answer(tiny_backend: Any) -> None:
    from logtoku_guard.decision.policy import Policy

    policy = Policy.from_dict(
        {
            "name": "always-warn",
            "rules": [{"name": "any", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": "warn"}],
        }
    )
    with BackgroundServer(build_app(tiny_backend, policy=policy)) as srv:
        r = httpx.post(
            f"{srv.base_url}/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        stream = httpx.post(
            f"{srv.base_url}/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "stream": True},
            timeout=60,
        )
    choice = r.json()["choices"][0]
    decision = choice["logtoku_guard"]
    assert decision["action"] == "warn" and decision["rule"] == "any" and decision["withheld"] is False
    assert choice["message"]["content"].endswith(policy.warn.disclaimer) and choice["finish_reason"] in ("stop", "length")
    assert "draft" not in decision and "tokens" not in decision  # the content is the answer; nothing else is repeated
    events = _events(stream.text)
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert streamed == choice["message"]["content"]
    assert events[-1]["choices"][0]["logtoku_guard"]["action"] == "warn"


def test_graceful_shutdown_finishes_in_flight_request(tiny_backend: Any) -> None:
    generating = threading.Event()
    tiny_backend._model.register_forward_pre_hook(lambda module, args: generating.set())
    srv = BackgroundServer(build_app(tiny_backend)).start()
    results: list[Any] = []

    def ask() -> None:
        body = {"messages": [{"role": "user", "content": "Count from one to ten"}], "max_tokens": 40, "temperature": 0}
        results.append(httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=60))

    worker = threading.Thread(target=ask)
    worker.start()
    assert generating.wait(60), "the request never reached the model"  # in flight: stop now
    srv.stop()
    worker.join(60)
    assert results and results[0].status_code == 200, results
    assert results[0].json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert not math.isnan(results[0].json()["choices"][0]["logtoku"]["reliability"] or 0.0)


def test_run_server_refuses_bad_settings_before_binding(tiny_backend: Any) -> None:
    import socket

    from logtoku_guard.errors import ConfigurationError
    from logtoku_guard.server import run_server
    from logtoku_guard.sockets import bind_socket

    with pytest.raises(ConfigurationError, match="--graceful-timeout"):
        run_server(tiny_backend, graceful_timeout=float("nan"))
    with pytest.raises(ConfigurationError, match="65535"):
        bind_socket("127.0.0.1", 70000)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"port {port} on 127.0.0.1 is already in use"):
            run_server(tiny_backend, port=port)
        with pytest.raises(ConfigurationError, match="already in use"):
            BackgroundServer(build_app(tiny_backend), port=port)


def test_background_server_holds_its_port_from_the_start(tiny_backend: Any) -> None:
    import socket

    srv = BackgroundServer(build_app(tiny_backend))  # bound, not yet started
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", srv.port))
    with srv:
        assert httpx.get(f"{srv.base_url[: -len('/v1')]}/health").status_code == 200


def test_a_remote_guard_decides_as_the_local_one(server: Any, tiny_backend: Any) -> None:
    """Through the real server, OpenAICompatibleBackend has the same ResponseStats (prompt side included)
    and the same guard_score as the local backend, streamed or not."""
    from logtoku_guard.calibration.guard_fit import shipped_guard
    from logtoku_guard.scoring.guard_score import with_guard_score
    from logtoku_guard.scoring.stats import STAT_NAMES, ResponseStats

    guard = shipped_guard("smollm2-135m-instruct")
    assert guard is not None and any(f.startswith("prompt_") for f in guard.features)
    question = "Who founded the Velmora Institute of Marine Acoustics?"
    local = tiny_backend.generate(question, GREEDY)
    with OpenAICompatibleBackend(server.base_url, tiny_backend.model_name, api_key=KEY) as remote:
        fetched = remote.generate(question, GREEDY)
        with remote.stream(question, GREEDY) as stream:
            list(stream)
        streamed = stream.generation
    mine = with_guard_score(ResponseStats.from_generation(local), guard, local)
    assert len(local.prompt_scores) > 3 and all(math.isfinite(mine.get(f)) for f in guard.features)
    for got in (fetched, streamed):
        assert [(t.id, t.text) for t in got.prompt_scores] == [(t.id, t.text) for t in local.prompt_scores]
        theirs = with_guard_score(ResponseStats.from_generation(got), guard, got)
        for name in STAT_NAMES:
            a, b = mine.get(name), theirs.get(name)
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-3), name
        assert theirs.guard_score == pytest.approx(mine.guard_score, abs=1e-3)


def test_developer_messages_are_system_instructions(client: Any, tiny_backend: Any) -> None:
    body = {"max_tokens": 6, "temperature": 0}
    developer = chat(client, messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}], **body)
    system = chat(client, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], **body)
    assert developer.status_code == 200, developer.text
    assert developer.json()["choices"][0]["message"] == system.json()["choices"][0]["message"]
    assert developer.json()["usage"] == system.json()["usage"]
