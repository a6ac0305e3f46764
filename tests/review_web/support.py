"""Shared pieces of the review page tests: a queued record with a heat-map, a live server."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from logtoku_guard.audit import AuditRecord, AuditStore, ReviewItem

ADMIN_TOKEN = "admin-token-for-tests-0123456789"
TOKENS = [
    {"index": 0, "token": "The", "au": 0.2, "eu": 0.1, "quadrant": "III", "logprob": -0.05, "top_logits": [9.0, 4.0]},
    {"index": 1, "token": " capital", "au": 1.2, "eu": 0.1, "quadrant": "IV", "logprob": -0.7, "top_logits": [7.0, 6.5]},
    {"index": 2, "token": " is", "au": 0.1, "eu": 0.9, "quadrant": "II", "logprob": -0.2, "top_logits": [8.0, 2.0]},
    {"index": 3, "token": " Lyon", "au": 1.5, "eu": 1.1, "quadrant": "I", "logprob": -2.3, "top_logits": [3.1, 3.0]},
    {"index": 4, "token": ".", "au": None, "eu": None, "quadrant": None, "logprob": -0.01, "top_logits": [10.0, 1.0]},
]
ANSWER = "The capital is Lyon."


HOSTILE_TO = "<img src=x onerror=alert(1)>"
TOOL_CALL = {
    "id": "call_1",
    "name": "transfer",
    "args": {"to": HOSTILE_TO, "amount": 500},
    "arguments": {
        "amount": {
            "tokens": 1,
            "mean_au": 1.4,
            "mean_eu": 1.2,
            "max_au": 1.4,
            "max_eu": 1.2,
            "logprob": -3.1,
            "quadrant": "I",
            "flagged": True,
        },
        "to": {
            "tokens": 9,
            "mean_au": 0.1,
            "mean_eu": 0.05,
            "max_au": 0.3,
            "max_eu": 0.1,
            "logprob": -0.4,
            "quadrant": "III",
            "flagged": False,
        },
    },
}


def tool_call_record() -> AuditRecord:
    """A transfer call sent to review: ``amount`` unsure (quadrant I, flagged), ``to`` hostile text."""
    args = '{\n  "amount": 500,\n  "to": "<img src=x onerror=alert(1)>"\n}'
    return make_record(
        answer=args, tokens=[], rule="unsure-amount", reason="transfer.amount max_eu 1.2 > 0.3", tool_calls=[TOOL_CALL]
    )


def make_record(**changes: Any) -> AuditRecord:
    fields: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct",
        "policy_name": "default",
        "policy_version": "1",
        "prompt": "What is the capital of France?",
        "answer": ANSWER,
        "action": "human_review",
        "reason": "reliability 0.31 < 0.45 (the profile's 10th percentile)",
        "rule": "low_reliability",
        "reliability": 0.31,
        "attempts": 2,
        "tokens": TOKENS,
        "stats": {"reliability": 0.31, "guard_score": 0.28, "reliability_percentile": 9.5},
    }
    fields.update(changes)
    return AuditRecord(**fields)


def queue(store: AuditStore, **changes: Any) -> ReviewItem:
    return store.record_for_review(make_record(**changes))


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_server(store: AuditStore, admin_token: str = ADMIN_TOKEN) -> Iterator[str]:
    """The real app under uvicorn, in a thread, on a free loopback port; yields its base URL."""
    import uvicorn

    from logtoku_guard.review_web import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(store, admin_token), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the review server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
