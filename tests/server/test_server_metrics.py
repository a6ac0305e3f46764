"""``GET /metrics``: a real Prometheus scrape of the real server after real requests."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend  # noqa: E402
from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.server import BackgroundServer, ServerSettings, build_app  # noqa: E402

KEY = "metrics-key"
ROWS = [[9.0, 8.5, 1.0], [6.0, 2.0, 1.0], [5.0, 4.9, 1.0]]


def scrape(base: str, **kwargs: Any) -> dict[str, list[Any]]:
    r = httpx.get(base[: -len("/v1")] + "/metrics", timeout=30, **kwargs)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def value(samples: list[Any], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_scrape_counts_requests_tokens_decisions_and_latency() -> None:
    backend = ScriptedBackend(lambda m: ScriptedAnswer(["Paris", " is", " big"], ROWS), model_name="scripted")
    rule = {"name": "shaky", "when": {"stat": "max_eu", "op": ">", "value": 0.0}, "action": "abstain"}
    policy = Policy.from_dict({"name": "p", "rules": [rule]})
    settings = ServerSettings(api_key=KEY)
    headers = {"Authorization": f"Bearer {KEY}"}
    with BackgroundServer(build_app(backend, policy=policy, settings=settings)) as srv:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        for stream in (False, True):
            assert (
                httpx.post(srv.base_url + "/chat/completions", json={**body, "stream": stream}, headers=headers).status_code
                == 200
            )
        assert httpx.post(srv.base_url + "/chat/completions", json={"messages": []}, headers=headers).status_code == 400
        assert httpx.get(srv.base_url[: -len("/v1")] + "/metrics", timeout=30).status_code == 401  # behind the key
        families = scrape(srv.base_url, headers=headers)
    requests = families["logtoku:requests"]
    assert value(requests, "logtoku:requests_total", endpoint="chat", outcome="ok") == 2
    assert value(requests, "logtoku:requests_total", endpoint="chat", outcome="client_error") == 1
    assert value(families["logtoku:generation_tokens"], "logtoku:generation_tokens_total") == 6
    assert value(families["logtoku:prompt_tokens"], "logtoku:prompt_tokens_total") >= 0
    decisions = families["logtoku:guard_decisions"]
    assert value(decisions, "logtoku:guard_decisions_total", action="abstain", rule="shaky") == 2
    assert value(families["logtoku:response_max_eu"], "logtoku:response_max_eu_count") == 2
    assert value(families["logtoku:e2e_request_latency_seconds"], "logtoku:e2e_request_latency_seconds_count") == 3
    for gauge in ("logtoku:num_requests_running", "logtoku:num_requests_waiting", "logtoku:batch_rows"):
        assert value(families[gauge], gauge) == 0  # nothing in flight while scraping


def test_metrics_open_or_off(tiny_backend: Any) -> None:
    with BackgroundServer(build_app(tiny_backend, settings=ServerSettings(api_key=KEY, metrics="open"))) as srv:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        httpx.post(srv.base_url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        families = scrape(srv.base_url)  # no key needed
        assert value(families["logtoku:time_to_first_token_seconds"], "logtoku:time_to_first_token_seconds_count") == 1
        assert value(families["logtoku:generation_tokens"], "logtoku:generation_tokens_total") == 3
    with BackgroundServer(build_app(tiny_backend, settings=ServerSettings(metrics="off"))) as srv:
        assert httpx.get(srv.base_url[: -len("/v1")] + "/metrics", timeout=30).status_code == 404
