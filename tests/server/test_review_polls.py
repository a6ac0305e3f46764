"""Review long polls (``GET /v1/logtoku/reviews/{id}?wait=``) never hold what generation needs (issue 43, N1).

The reproducer: with a policy that sends answers to human review and a store, 45 polls whose
sockets closed right after sending, or 60 live ones, made a chat request wait for the polls'
whole ``wait`` (59 s instead of 2 s): each poll held one of AnyIO's 40 default threads, which
generation used too. Here, over real sockets on 127.0.0.1 with the tiny random model, 100 live
polls and 45 dropped ones leave a chat request's time near its time alone, the dropped polls
end as their clients go, and the live ones still end at their ``wait``.
"""

from __future__ import annotations

import socket
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from logtoku_guard.audit import AuditStore  # noqa: E402
from logtoku_guard.audit.waiting import SharedReads, await_decision  # noqa: E402
from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.server import BackgroundServer, Engine, ThreadRunner, create_app  # noqa: E402

LIVE_POLLS = 100
DROPPED_POLLS = 45
WAIT_S = 12
CHAT = {"messages": [{"role": "user", "content": "Count from one to ten"}], "max_tokens": 48, "temperature": 0}


def always_review() -> Policy:
    rule = {"name": "always", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": "human_review"}
    return Policy.from_dict({"name": "always-review", "rules": [rule]})


def send_poll(port: int, review_id: int, wait: float) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    s.sendall(f"GET /v1/logtoku/reviews/{review_id}?wait={wait} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def read_response(s: socket.socket) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < content_length(got):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def content_length(raw: bytes) -> int:
    for line in raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def timed_chat(base_url: str) -> float:
    start = time.perf_counter()
    r = httpx.post(f"{base_url}/chat/completions", json=CHAT, timeout=120)
    took = time.perf_counter() - start
    assert r.status_code == 200, r.text
    return took


def request_tasks(srv: BackgroundServer) -> int:
    """Requests the server is running now (uvicorn's own count)."""
    return len(srv.server.server_state.tasks)


def wait_for_tasks(srv: BackgroundServer, n: int) -> None:
    deadline = time.monotonic() + 10
    while request_tasks(srv) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert request_tasks(srv) >= n, f"only {request_tasks(srv)} of {n} polls reached the server"


@pytest.mark.slow
def test_long_polls_leave_generation_its_threads(tiny_backend: Any, tmp_path: Path) -> None:
    with AuditStore(tmp_path / "audit.db") as store:
        engine = Engine(ThreadRunner(tiny_backend), policy=always_review(), store=store)
        with BackgroundServer(create_app(engine=engine)) as srv:
            first = httpx.post(f"{srv.base_url}/chat/completions", json=CHAT, timeout=120).json()
            review_id = first["choices"][0]["logtoku_guard"]["review_id"]
            alone = statistics.median(timed_chat(srv.base_url) for _ in range(3))

            # Polls whose clients hang up end with them (no request of theirs keeps running).
            dropped = [send_poll(srv.port, review_id, WAIT_S) for _ in range(DROPPED_POLLS)]
            wait_for_tasks(srv, DROPPED_POLLS)
            for s in dropped:
                s.close()
            deadline = time.monotonic() + WAIT_S / 2
            while request_tasks(srv) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert request_tasks(srv) == 0, f"{request_tasks(srv)} polls still running after their clients hung up"

            # 100 live polls (and more dropped ones) while a chat request is answered.
            opened = time.monotonic()
            live = [send_poll(srv.port, review_id, WAIT_S) for _ in range(LIVE_POLLS)]
            for s in [send_poll(srv.port, review_id, WAIT_S) for _ in range(DROPPED_POLLS)]:
                s.close()
            wait_for_tasks(srv, LIVE_POLLS)
            beside = statistics.median(timed_chat(srv.base_url) for _ in range(3))
            chats_done = time.monotonic() - opened
            plain = httpx.get(f"{srv.base_url}/logtoku/reviews/{review_id}", timeout=120)

            answers = []
            for s in live:
                answers.append((read_response(s), time.monotonic() - opened))
                s.close()

    assert beside <= 5 * alone + 0.5, f"a chat took {beside:.2f} s beside {LIVE_POLLS} long polls, {alone:.2f} s alone"
    assert chats_done < WAIT_S, "the chat requests waited for the polls to end"
    assert plain.status_code == 200 and plain.json()["status"] == "pending"
    for raw, at in answers:
        assert raw.startswith(b"HTTP/1.1 200"), raw[:300]
        assert b'"status":"pending"' in raw
        assert WAIT_S - 1 <= at <= 2 * WAIT_S, f"a poll with wait={WAIT_S} ended after {at:.1f} s"


def test_a_review_carries_its_object_name(tiny_backend: Any, tmp_path: Path) -> None:
    """``GET /v1/logtoku/reviews/{id}`` says what it is (``"object": "logtoku.review"``), pending or decided."""
    with AuditStore(tmp_path / "audit.db") as store:
        engine = Engine(ThreadRunner(tiny_backend), policy=always_review(), store=store)
        with BackgroundServer(create_app(engine=engine)) as srv:
            first = httpx.post(f"{srv.base_url}/chat/completions", json=CHAT, timeout=120).json()
            review_id = first["choices"][0]["logtoku_guard"]["review_id"]
            pending = httpx.get(f"{srv.base_url}/logtoku/reviews/{review_id}", timeout=60).json()
            store.reject(review_id, "alice", "invented")
            waited = httpx.get(f"{srv.base_url}/logtoku/reviews/{review_id}", params={"wait": 0.2}, timeout=60).json()
    assert pending["object"] == "logtoku.review" and pending["id"] == review_id
    assert waited["object"] == "logtoku.review" and waited["status"] == "rejected" and waited["answer"] is None


class CountingStore:
    """A review queue in memory: counts reads; item 1 is decided once ``decide_at`` has passed."""

    def __init__(self, decide_after: float | None) -> None:
        self.reads = 0
        self.decide_at = None if decide_after is None else time.monotonic() + decide_after

    def review_item(self, review_id: int) -> Any:
        self.reads += 1
        decided = self.decide_at is not None and time.monotonic() >= self.decide_at
        return SimpleNamespace(id=review_id, decided=decided, status="approved" if decided else "pending")


def test_waiters_share_one_read_per_interval_and_wake_on_the_verdict() -> None:
    import anyio

    store = CountingStore(decide_after=0.6)
    results: list[Any] = []

    async def main() -> float:
        reads = SharedReads(fresh=0.1)
        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(50):

                async def one() -> None:
                    results.append(await await_decision(store, 1, timeout=5, poll_interval=0.1, reads=reads))

                tg.start_soon(one)
        return time.monotonic() - start

    took = anyio.run(main)
    assert len(results) == 50 and all(r.decided for r in results)
    assert took < 3, f"the waiters took {took:.1f} s to see a verdict given after 0.6 s"
    # each waiter's first read is its own (never older than its request); the later ones are shared
    later = store.reads - 50
    assert later <= 15, f"50 waiters polling every 0.1 s for ~0.7 s read the item {later} more times (shared: ~7)"


def test_a_wait_ends_at_its_timeout_or_when_cancelled() -> None:
    import anyio

    store = CountingStore(decide_after=None)

    async def main() -> tuple[float, float, Any]:
        start = time.monotonic()
        item = await await_decision(store, 1, timeout=0.5, poll_interval=0.1, reads=SharedReads(fresh=0.1))
        timed = time.monotonic() - start
        start = time.monotonic()
        with anyio.move_on_after(0.3):
            await await_decision(store, 1, timeout=30, poll_interval=0.1, reads=SharedReads(fresh=0.1))
        return timed, time.monotonic() - start, item

    timed, cancelled, item = anyio.run(main)
    assert not item.decided and 0.45 <= timed < 2
    assert cancelled < 2


def test_a_wait_checks_its_numbers() -> None:
    import anyio

    from logtoku_guard.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="timeout"):
        anyio.run(lambda: await_decision(CountingStore(None), 1, timeout=-1))
