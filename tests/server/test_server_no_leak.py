"""A withheld draft leaves no trace in anything the client receives, through the real server.

Every route of the guard (pass, warn, retrieve without a retriever, abstain, human review, raise)
is driven through ``logtoku-guard serve``'s app on 127.0.0.1, streaming and not, chat and legacy
completions, with ``logprobs`` and ``top_logprobs`` asked for. The scripted draft is made of words
that appear nowhere else ("Zorblaxian", "Quintessa", "Velmoraq"): the raw bytes of each response
are searched for every one of them, and every field of the body is checked for what it may hold.
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
QUESTION = "Who founded the Zorblax Institute?"


def scripted() -> ScriptedBackend:
    return ScriptedBackend(lambda messages: ScriptedAnswer(DRAFT, ROWS), model_name="scripted")


def policy(action: str) -> Policy:
    return Policy.from_dict(
        {
            "name": f"always-{action}",
            "rules": [{"name": "always", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": action}],
        }
    )


def requests() -> list[tuple[str, dict[str, Any]]]:
    chat = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16, "logprobs": True, "top_logprobs": 2}
    completion = {"prompt": QUESTION, "max_tokens": 16, "logprobs": 2}
    usage = {"stream_options": {"include_usage": True}}
    plain_chat = {k: v for k, v in chat.items() if k not in ("logprobs", "top_logprobs")}
    plain_completion = {k: v for k, v in completion.items() if k != "logprobs"}
    return [
        ("/chat/completions", chat),
        ("/chat/completions", {**chat, "stream": True, **usage}),
        ("/chat/completions", plain_chat),
        ("/chat/completions", {**plain_chat, "stream": True, **usage}),
        ("/completions", completion),
        ("/completions", {**completion, "stream": True, **usage}),
        ("/completions", plain_completion),
        ("/completions", {**plain_completion, "stream": True, **usage}),
    ]


def bodies(text: str, stream: bool) -> list[dict[str, Any]]:
    if not stream:
        return [json.loads(text)]
    chunks = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with AuditStore(tmp_path / "audit.db") as s:
        yield s


@pytest.mark.parametrize("action", ["abstain", "human_review", "retrieve"])
def test_a_withheld_draft_is_in_no_byte_of_any_response(action: str, store: Any) -> None:
    """retrieve: the server has no retriever, so the policy's fallback (abstain) answers instead."""
    pol = policy(action)
    with BackgroundServer(build_app(scripted(), policy=pol, store=store)) as srv:
        for path, body in requests():
            r = httpx.post(srv.base_url + path, json=body, timeout=60)
            raw = r.content
            assert r.status_code == 200, raw
            for word in SECRET:
                assert word not in raw, (action, path, body.get("stream"), word, raw[:2000])
            events = bodies(r.text, bool(body.get("stream")))
            chat = path == "/chat/completions"
            ends = [c for e in events for c in e["choices"] if c.get("finish_reason")]
            # a chat answer is a refusal (OpenAI's finish_reason stop); the legacy API has no refusal channel
            assert len(ends) == 1 and ends[0]["finish_reason"] == ("stop" if chat else "content_filter")
            decision = ends[0]["logtoku_guard"]
            assert decision["withheld"] is True and decision["action"] == ("abstain" if action == "retrieve" else action)
            assert not {"draft", "tokens", "answer"} & set(decision)
            assert decision["generated_tokens"] == len(DRAFT)  # the guard's own cost, in its extension
            asked = "logprobs" in body
            for event in events:
                for choice in event["choices"]:
                    lp = choice.get("logprobs")
                    assert "logtoku" not in choice
                    if lp is None:
                        continue
                    assert asked  # never sent unasked; asked, never null on the whole answer (below)
                    if chat:
                        assert lp == {"content": [], "refusal": []}
                    else:
                        assert lp["tokens"] == [] and lp["token_logprobs"] == [] and lp["logtoku"] == []
            if asked:
                assert any(c.get("logprobs") is not None for e in events for c in e["choices"])
            if chat:
                text = "".join(c.get("delta", {}).get("refusal") or "" for e in events for c in e["choices"]) or (
                    events[0]["choices"][0].get("message", {}).get("refusal") or ""
                )
                assert not any(
                    c.get("delta", {}).get("content") or c.get("message", {}).get("content") for e in events for c in e["choices"]
                )
            else:
                text = "".join(c.get("text") or "" for e in events for c in e["choices"])
            if action == "human_review":
                assert str(decision["review_id"]) in text and decision["review_id"] is not None
            else:
                assert text == pol.abstain.message
            used = [e["usage"] for e in events if e.get("usage")]
            assert used and used[-1]["completion_tokens"] == 0  # the scripted backend has no tokenizer to count the message
    if action == "human_review":
        items = store.pending()
        assert items and items[0].record.answer.startswith("The Zorblaxian")  # the operator reads the draft in the store


def test_usage_counts_the_answer_sent_in_the_backends_tokens(tiny_backend: Any) -> None:
    pol = policy("abstain")
    with BackgroundServer(build_app(tiny_backend, policy=pol)) as srv:
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8, "temperature": 0}
        r = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60).json()
    assert r["choices"][0]["message"]["refusal"] == pol.abstain.message
    assert r["usage"]["completion_tokens"] == tiny_backend.count_tokens(pol.abstain.message)
    assert r["choices"][0]["logtoku_guard"]["generated_tokens"] == 8


def test_raise_answers_422_with_the_decision_and_without_the_draft() -> None:
    with BackgroundServer(build_app(scripted(), policy=policy("raise"))) as srv:
        for path, body in requests():
            r = httpx.post(srv.base_url + path, json=body, timeout=60)
            for word in SECRET:
                assert word not in r.content, (path, word)
            events = [json.loads(r.text)] if not body.get("stream") else bodies(r.text, True)
            error = next(e["error"] for e in events if "error" in e)
            assert (
                error["code"] == "guard_rejected"
                and error["logtoku_guard"]["action"] == "raise"
                and error["logtoku_guard"]["withheld"] is True
            )
            assert "draft" not in error["logtoku_guard"] and "tokens" not in error["logtoku_guard"]


@pytest.mark.parametrize("action", ["pass", "warn"])
def test_a_delivered_draft_comes_with_its_logprobs_and_scores(action: str) -> None:
    with BackgroundServer(build_app(scripted(), policy=policy(action))) as srv:
        for path, body in requests():
            r = httpx.post(srv.base_url + path, json=body, timeout=60)
            assert r.status_code == 200 and b"Zorblaxian" in r.content
            events = bodies(r.text, bool(body.get("stream")))
            end = next(c for e in events for c in e["choices"] if c.get("finish_reason"))
            assert end["finish_reason"] == "stop" and end["logtoku_guard"]["withheld"] is False and "logtoku" in end
            if action == "pass":
                assert any(c.get("logprobs") for e in events for c in e["choices"]) == ("logprobs" in body)
            used = [e["usage"] for e in events if e.get("usage")]
            assert used[-1]["completion_tokens"] == len(DRAFT)


def test_a_served_human_review_from_request_to_released_answer(tmp_path: Path) -> None:
    """The README's served review: the answer is withheld with a review id; ``logtoku-guard review
    approve`` on the same store decides it; the long poll returns the released (edited) answer."""
    import threading
    import time

    from typer.testing import CliRunner

    from logtoku_guard.cli import app as cli

    db = tmp_path / "audit.db"
    with AuditStore(db) as store, BackgroundServer(build_app(scripted(), policy=policy("human_review"), store=store)) as srv:
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16}
        answer = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60).json()["choices"][0]
        review_id = answer["logtoku_guard"]["review_id"]
        assert answer["finish_reason"] == "stop" and isinstance(review_id, int)
        assert answer["message"]["content"] is None and str(review_id) in answer["message"]["refusal"]
        url = f"{srv.base_url}/logtoku/reviews/{review_id}"
        pending = httpx.get(url, timeout=30)
        assert pending.status_code == 200 and pending.json()["status"] == "pending" and pending.json()["answer"] is None
        for word in SECRET:
            assert word not in pending.content  # nothing of the draft before a reviewer approves it
        polled: list[Any] = []
        poller = threading.Thread(target=lambda: polled.append(httpx.get(url, params={"wait": 30}, timeout=60)))
        started = time.monotonic()
        poller.start()
        time.sleep(0.5)
        res = CliRunner().invoke(
            cli, ["review", "approve", str(review_id), "-r", "alice", "--answer", "Nobody: it is invented.", "--store", str(db)]
        )
        assert res.exit_code == 0, res.output
        poller.join(60)
        verdict = polled[0].json()
        assert time.monotonic() - started < 20  # released by the verdict, not by the wait running out
        assert verdict == {
            **verdict,
            "status": "approved",
            "decided": True,
            "answer": "Nobody: it is invented.",
            "edited": True,
            "reviewer": "alice",
        }
        assert httpx.get(f"{srv.base_url}/logtoku/reviews/{'9' * 5000}", timeout=30).status_code == 404
        assert httpx.get(f"{srv.base_url}/logtoku/reviews/999999", timeout=30).status_code == 404
        assert httpx.get(url, params={"wait": "inf"}, timeout=30).status_code == 400


def test_reviews_need_a_store() -> None:
    with BackgroundServer(build_app(scripted())) as srv:
        r = httpx.get(f"{srv.base_url}/logtoku/reviews/1", timeout=30)
    assert r.status_code == 404 and "--store" in r.json()["error"]["message"]
