"""Half-sent requests time out, open connections stay under the file limit, the log is not flooded (issue 43, N3).

The reproducer: under ``ulimit -n 1024``, 1,100 sockets each sending ``GET /health HTTP/1.1\\r\\nHost: x\\r\\n``
and nothing more stayed open for ever, normal requests timed out, and the log took 586,958
tracebacks (``OSError: [Errno 24] Too many open files``) in 90 s. Here the same, scaled down: a
server in a subprocess under a soft file limit of 320 (so at most 192 connections), 300 half-sent
sockets, normal requests answered meanwhile, every half-sent socket closed by the header timeout
(or evicted to make room), and a few log lines without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from logtoku_guard.errors import ConfigurationError  # noqa: E402
from logtoku_guard.server.connections import RESERVED_FILES, ConnectionLimits  # noqa: E402
from logtoku_guard.server.run import free_port  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
FILE_LIMIT = 320
HALF_SENT = 300
HEADER_TIMEOUT = 3.0

SERVE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
sys.path.insert(0, sys.argv[2])
from support.tiny import make_model, make_tokenizer
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.server import run_server
from logtoku_guard.server.connections import ConnectionLimits

tok = make_tokenizer()
backend = TransformersBackend("tiny", model_obj=make_model(tok), tokenizer=tok)
limits = ConnectionLimits(header_timeout=float(sys.argv[4]), body_timeout=float(sys.argv[4]))
run_server(backend, port=int(sys.argv[1]), graceful_timeout=5, log_level="info", connections=limits)
"""


def closed_by_server(s: socket.socket, timeout: float) -> bool:
    """Whether the server closed ``s`` within ``timeout`` seconds (EOF or a reset; a 503 first counts too)."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def half_sent(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
    return s


@pytest.mark.slow
def test_half_sent_connections_time_out_under_a_low_file_limit(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(port), str(TESTS), str(FILE_LIMIT), str(HEADER_TIMEOUT)],
            stdout=log,
            stderr=log,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"
    sockets: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        opened = time.monotonic()
        for _ in range(HALF_SENT):
            with contextlib.suppress(OSError):  # a connection refused or reset at once is the server protecting itself
                sockets.append(half_sent(port))
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
        slow_body = socket.create_connection(("127.0.0.1", port), timeout=30)
        slow_body.sendall(head + b'{"messages": [')  # 14 of the 500 bytes announced
        # Normal requests are answered meanwhile (each evicts the oldest half-sent socket if the cap is reached).
        for _ in range(3):
            assert httpx.get(f"{base}/health", timeout=30).status_code == 200
            chat = {"messages": [{"role": "user", "content": "Paris"}], "max_tokens": 4, "temperature": 0}
            assert httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=30).status_code == 200
        still_open = [s for s in sockets if not closed_by_server(s, max(0.1, opened + HEADER_TIMEOUT + 5 - time.monotonic()))]
        assert not still_open, f"{len(still_open)} of {len(sockets)} half-sent connections still open after the header timeout"
        assert closed_by_server(slow_body, HEADER_TIMEOUT + 5), "a request whose body never ended was not closed"
        slow_body.close()
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    finally:
        for s in sockets:
            s.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    output = log_path.read_text()
    assert "Traceback" not in output, output[-3000:]
    assert "Too many open files" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "connection" in line.lower()]
    assert 1 <= len(lines) <= 10, output[-3000:]
    assert any("--header-timeout" in line for line in lines), output[-3000:]


CAP = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.server.connections import connection_cap
try:
    print(connection_cap(None if sys.argv[3] == "-" else int(sys.argv[3])), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
except ConfigurationError as exc:
    print("error:", exc)
"""


def cap_under(soft: int, hard: int, requested: int | None) -> str:
    args = [sys.executable, "-c", CAP, str(soft), str(hard), "-" if requested is None else str(requested)]
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_the_connection_cap_is_checked_against_the_file_limit() -> None:
    assert cap_under(1024, 1024, None) == f"{1024 - RESERVED_FILES} 1024"
    refused = cap_under(1024, 1024, 5000)
    assert refused.startswith("error: --max-connections 5000 needs 5128 open files") and "ulimit -n 5128" in refused
    assert f"--max-connections {1024 - RESERVED_FILES} or less" in refused
    assert cap_under(1024, 8192, 5000) == "5000 5128"  # the soft limit is raised up to the hard one
    assert cap_under(100, 100, None).startswith("error: this process may open only 100 files")


def test_connection_limits_check_their_numbers() -> None:
    for bad in ({"max_connections": 0}, {"max_connections": True}, {"header_timeout": 0}, {"body_timeout": float("nan")}):
        with pytest.raises(ConfigurationError, match="must be"):
            ConnectionLimits(**bad)


def test_serve_refuses_a_cap_above_the_file_limit(tmp_path: Path) -> None:
    """``serve --max-connections`` is checked before the model loads, with the fix in the message."""
    script = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); "
        "from logtoku_guard.cli import app; sys.argv = ['logtoku-guard'] + sys.argv[1:]; app()"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, "serve", "--max-connections", "1000", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--max-connections 1000 needs 1128 open files" in out.stderr and "Traceback" not in out.stderr


def test_unreadable_bodies_are_refused_with_what_is_wrong(tiny_backend: object) -> None:
    """Invalid UTF-8, a number too long to read and a lone surrogate each get a 400 saying so, streamed or
    not: the body is refused before any stream opens (not a 200 and then an error event)."""
    from logtoku_guard.server import BackgroundServer, build_app

    ok = b'{"messages": [{"role": "user", "content": "Paris"}], "max_tokens": 2, "temperature": 0'
    cases = [
        (ok + b', "user": "\xff\xfe"}', "not valid UTF-8 (byte 0xff at offset"),
        (ok + b', "seed": ' + b"9" * 5000 + b"}", "a number of more than"),
        (ok.replace(b"Paris", b"Par\\ud800is") + b"}", "body.messages[0].content holds the lone surrogate '\\ud800'"),
        # a key of 100,000 characters is named by its ends, not echoed (found by the fuzz test)
        (ok + b', "' + b"k" * 100_000 + b'": {"\\ud800": null}}', f"body.{'k' * 20}...{'k' * 10} key holds the lone surrogate"),
    ]
    with BackgroundServer(build_app(tiny_backend)) as srv:  # type: ignore[arg-type]
        url = f"{srv.base_url}/chat/completions"
        for body, expected in cases:
            for stream in (b"", b', "stream": true'):
                sent = body[:-1] + stream + b"}"
                r = httpx.post(url, content=sent, headers={"Content-Type": "application/json"}, timeout=60)
                assert r.status_code == 400, r.text
                assert r.headers["content-type"].startswith("application/json")
                assert expected in r.json()["error"]["message"], r.text
                assert len(r.json()["error"]["message"]) < 300, r.text[:500]
        pair = ok.replace(b"Paris", b"\\ud83d\\ude00") + b"}"  # a surrogate pair is one character
        assert httpx.post(url, content=pair, headers={"Content-Type": "application/json"}, timeout=60).status_code == 200
        digits = ok.replace(b"Paris", b"7" * 5000) + b"}"  # digits in a string are text (too long for the tiny model)
        r = httpx.post(url, content=digits, headers={"Content-Type": "application/json"}, timeout=60)
        assert "context window" in r.json()["error"]["message"], r.text


def test_a_connection_over_the_cap_gets_a_503_when_none_is_half_sent(tiny_backend: object) -> None:
    """Three kept-alive connections (each answered, none sending a head) fill a cap of 3: a fourth gets a 503."""
    from logtoku_guard.server import BackgroundServer, build_app

    limits = ConnectionLimits(max_connections=3)
    with BackgroundServer(build_app(tiny_backend), connections=limits) as srv:  # type: ignore[arg-type]
        kept = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            kept.append(s)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := extra.recv(65536):
                    got += chunk
        assert got.startswith(b"HTTP/1.1 503") and b"too many open connections" in got, got
        for s in kept:
            s.close()


def test_out_of_files_accept_errors_are_one_line(caplog: pytest.LogCaptureFixture) -> None:
    import errno
    import logging

    from logtoku_guard.server.connections import quiet_accept_errors

    quiet_accept_errors()
    quiet_accept_errors()  # idempotent
    log = logging.getLogger("asyncio")
    caplog.set_level(logging.WARNING)
    for _ in range(1000):
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError:
            log.error("socket.accept() out of system resource", exc_info=True)
    lines = [r for r in caplog.records if "accept" in r.getMessage()]
    assert len(lines) <= 1 and all(r.exc_info is None for r in lines)
    assert not any("Too many open files" in r.getMessage() and r.exc_info for r in caplog.records)
