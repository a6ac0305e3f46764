"""A client that goes away stops its generation, on every path, through the real server.

Each case starts a long answer (``max_tokens`` far beyond what the client waits for), hangs up
after a fraction of a second, then checks, from the backend's own record of what it generated,
that the generation ended ``"cancelled"`` well before ``max_tokens``: streamed or not, guarded or
not, both endpoints, both backends. The next request is then answered at once (the row was freed).
No timing is asserted: the evidence is the cancelled generation's token count.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from support.served import llamacpp_served, tiny_served  # noqa: E402

from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402

LONG = 1000  # within the server's default max_tokens limit (1024)


class Recorded:
    """The backend's generations as they end (its ``stream``, which every served generation goes through)."""

    def __init__(self, backend: Any) -> None:
        self.ended: list[Any] = []
        self.started = 0
        self.lock = threading.Condition()
        real = backend.stream

        def stream(*args: Any, **kwargs: Any) -> Any:
            s = real(*args, **kwargs)
            with self.lock:
                self.started += 1
                self.lock.notify_all()
            result = s._result

            def recorded() -> Any:
                g = result()
                with self.lock:
                    self.ended.append(g)
                    self.lock.notify_all()
                return g

            s._result = recorded
            return s

        backend.stream = stream

    def wait_started(self, n: int, timeout: float = 60.0) -> None:
        """Until the ``n``-th generation has started (a guarded stream sends its first events before it does)."""
        with self.lock:
            self.lock.wait_for(lambda: self.started >= n, timeout)

    def wait(self, n: int, timeout: float = 60.0) -> list[Any]:
        with self.lock:
            self.lock.wait_for(lambda: len(self.ended) >= n, timeout)
            return list(self.ended)


def hang_up(url: str, payload: dict[str, Any], stream: bool, generating: Any = None) -> None:
    """Send ``payload``, then close the connection: after two events of a stream (and, with
    ``generating``, once it says the generation has started), or after 0.4 s of waiting."""
    if stream:
        with httpx.Client(timeout=60) as client, client.stream("POST", url, json=payload) as r:
            events = r.iter_lines()
            for _ in range(2):
                next(events)
            if generating is not None:
                generating()  # a guarded stream's first events come before its generation starts
        return  # leaving the blocks closes the connection mid-stream
    with pytest.raises(httpx.TimeoutException):  # the client gives up and closes its connection
        httpx.post(url, json=payload, timeout=httpx.Timeout(0.4, connect=5.0))


GUARD = Policy.from_dict(
    {"name": "p", "rules": [{"name": "r", "when": {"stat": "reliability", "op": "<", "value": -1e9}, "action": "abstain"}]}
)


@pytest.mark.parametrize("kind", ["transformers", "llamacpp"])
@pytest.mark.parametrize("guarded", [False, True], ids=["unguarded", "guarded"])
def test_a_client_that_hangs_up_stops_its_generation(kind: str, guarded: bool, tiny_tokenizer: Any) -> None:
    backend = (
        tiny_served(tiny_tokenizer, max_positions=2048, max_batch=1) if kind == "transformers" else llamacpp_served(max_batch=1)
    )
    record = Recorded(backend)
    cases = [
        ("/chat/completions", {"messages": [{"role": "user", "content": "Tell me a long story."}]}, False),
        ("/chat/completions", {"messages": [{"role": "user", "content": "Tell me a long story."}]}, True),
        ("/completions", {"prompt": "Once upon a time"}, False),
    ]
    with BackgroundServer(build_app(backend, policy=GUARD if guarded else None)) as srv:
        for n, (path, body, stream) in enumerate(cases, 1):
            payload = {**body, "max_tokens": LONG, "temperature": 0, "stream": stream}
            hang_up(srv.base_url + path, payload, stream, lambda n=n: record.wait_started(n))
            (*_, ended) = record.wait(n)
            assert ended.finish_reason == "cancelled" and len(ended.tokens) < LONG, (path, stream, len(ended.tokens))
        started = time.monotonic()
        ok = httpx.post(
            srv.base_url + "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert ok.status_code == 200 and time.monotonic() - started < 60
    getattr(backend, "close", lambda: None)()
