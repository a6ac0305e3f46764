"""Clients that hang up mid-stream: over a real socket on 127.0.0.1, the server keeps answering and shuts down at once.

A stream holds one of the runner's slots while it generates. Each dropped stream must give its
slot back (whichever task closes the abandoned generator), or after ``workers`` drops every
request waits for ever and a graceful shutdown waits its whole grace period.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from logtoku_guard.server import BackgroundServer, Engine, ThreadRunner, create_app  # noqa: E402
from logtoku_guard.server.run import free_port  # noqa: E402

WORKERS = 2
DROPS = 2 * WORKERS  # each endpoint dropped WORKERS times: more drops than slots
TESTS = Path(__file__).resolve().parents[1]
QUESTION = [{"role": "user", "content": "Count from one to ten"}]


def stream_body(chat: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0, "stream": True}
    body.update({"messages": QUESTION} if chat else {"prompt": "Count from one to ten"})
    return body


def drop_after_first_token(port: int, chat: bool, max_tokens: int) -> bytes:
    """POST a streaming request over a raw socket, read up to the first token event, hang up."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    payload = json.dumps(stream_body(chat, max_tokens)).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    events = 2 if chat else 1  # a chat stream opens with the assistant-role chunk
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head.encode() + payload)
        while got.count(b"data: ") < events:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    return got


def drop_streams(port: int, max_tokens: int) -> list[bytes]:
    return [drop_after_first_token(port, chat=i % 2 == 0, max_tokens=max_tokens) for i in range(DROPS)]


def answers_all(base_url: str, n: int = 2 * WORKERS) -> list[Any]:
    """``n`` requests at once (plain chat, plain completion, and both streamed to the end)."""
    results: list[Any] = [None] * n

    def ask(i: int) -> None:
        chat, stream = i % 2 == 0, i % 4 >= 2
        body: dict[str, Any] = {"max_tokens": 4, "temperature": 0, "stream": stream}
        body.update({"messages": QUESTION} if chat else {"prompt": "Paris"})
        try:
            results[i] = httpx.post(f"{base_url}/{'chat/completions' if chat else 'completions'}", json=body, timeout=30)
        except httpx.HTTPError as exc:  # a timeout here is the hang this file is about
            results[i] = exc

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def assert_answered(results: list[Any]) -> None:
    for r in results:
        assert isinstance(r, httpx.Response), f"no answer after the dropped streams: {r!r}"
        assert r.status_code == 200, r.text
        assert "error" not in r.text[:200]


def wait_until_free(runner: ThreadRunner, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while runner.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.busy == 0, f"{runner.busy} of {runner.workers} slots still held after every client hung up"


def never_passes() -> Any:
    from logtoku_guard.decision.policy import Policy

    rule = {"name": "never", "when": {"stat": "reliability", "op": "<", "value": -1e9}, "action": "abstain"}
    return Policy.from_dict({"name": "pass-all", "rules": [rule]})


def watch_server_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Capture uvicorn's own error log too (it does not propagate to the root logger)."""
    caplog.set_level(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).addHandler(caplog.handler)


def server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).removeHandler(caplog.handler)
    gc.collect()  # an abandoned generator's finalizer error is logged when its task is collected
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.slow
@pytest.mark.parametrize("guarded", [False, True], ids=["unguarded", "guarded"])
def test_dropped_streams_free_their_slots_and_the_server_still_answers(
    tiny_backend: Any, guarded: bool, caplog: pytest.LogCaptureFixture
) -> None:
    runner = ThreadRunner(tiny_backend, WORKERS)
    engine = Engine(runner, policy=never_passes() if guarded else None)
    srv = BackgroundServer(create_app(engine=engine), graceful_timeout=30)
    watch_server_logs(caplog)
    srv.start()
    try:
        dropped = drop_streams(srv.port, max_tokens=200 if not guarded else 40)
        if not guarded:  # hung up mid-generation, not after the end
            assert not any(b"[DONE]" in d for d in dropped)
        wait_until_free(runner)
        assert_answered(answers_all(srv.base_url))
        wait_until_free(runner)
    finally:
        start = time.monotonic()
        srv.stop()
        stopped_in = time.monotonic() - start
    assert not srv._thread.is_alive()
    assert stopped_in < 10, f"shutdown took {stopped_in:.1f} s of its 30 s grace period"
    assert not server_errors(caplog)


def test_a_client_that_hangs_up_mid_body_is_no_server_error(tiny_backend: Any, caplog: pytest.LogCaptureFixture) -> None:
    srv = BackgroundServer(create_app(engine=Engine(ThreadRunner(tiny_backend, WORKERS))))
    watch_server_logs(caplog)
    with srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n"
            s.sendall(head + b'\r\n{"messages": [')  # 14 of the 500 bytes announced
        assert_answered(answers_all(srv.base_url, n=2))
    assert not server_errors(caplog)


def test_a_dropped_stream_can_free_its_slot_from_another_task(tiny_backend: Any) -> None:
    """The slot does not belong to a task: the event loop may finalize a dropped generator in a new one."""
    import anyio

    runner = ThreadRunner(tiny_backend, 1)

    async def scenario() -> None:
        entered = anyio.Event()
        leave = anyio.Event()
        slot = runner.slot()

        async def holder() -> None:
            await slot.__aenter__()
            entered.set()
            await leave.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(holder)
            await entered.wait()
            assert runner.busy == 1
            await slot.__aexit__(None, None, None)  # left by this task, not the holder's
            assert runner.busy == 0
            leave.set()
        with anyio.fail_after(10):
            assert await runner.run(lambda b: b.model_name) == "tiny"
        assert runner.busy == 0

    anyio.run(scenario)


SERVE = """
import sys
sys.path.insert(0, sys.argv[2])
from support.tiny import make_model, make_tokenizer
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.server import run_server

tok = make_tokenizer()
backend = TransformersBackend("tiny", model_obj=make_model(tok), tokenizer=tok, max_batch=1)
run_server(backend, port=int(sys.argv[1]), graceful_timeout=30, log_level="warning")
"""


@pytest.mark.slow
def test_sigterm_is_prompt_after_clients_hang_up(tmp_path: Path) -> None:
    """``run_server`` (what ``serve`` runs) with max batch 1 (2 slots): drop 4 streams, ask, SIGTERM."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    log = (tmp_path / "server.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port), str(TESTS)], stdout=log, stderr=log, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        dropped = drop_streams(port, max_tokens=200)
        assert not any(b"[DONE]" in d for d in dropped)
        assert_answered(answers_all(f"{base}/v1"))
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log.seek(0)
    output = log.read()
    log.close()
    assert "Traceback" not in output and "CapacityLimiter" not in output, output[-3000:]
