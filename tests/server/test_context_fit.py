"""A request that cannot fit the model's context window is refused before anything is generated (issue 43).

Through the real server, on both backends: a prompt that fills the window is a 400 JSON error,
streamed or not (no 200 and then an error event); a ``max_tokens`` the request sends that does not
fit after the prompt is a 400 naming the prompt's tokens, the window and the most that fits, as
vLLM refuses it; a request that sends none is answered within what fits.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from support.served import llamacpp_served, tiny_served  # noqa: E402

from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402

WINDOW = 256
LONG = "The tide tables of the harbour were read again. " * 60
QUESTION = "What was read again?"


def served(kind: str, tiny_tokenizer: Any) -> Any:
    if kind == "transformers":
        return tiny_served(tiny_tokenizer, max_positions=WINDOW)
    return llamacpp_served(n_ctx=WINDOW, max_batch=2)


def body(content: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


def assert_json_400(r: Any, *needles: str) -> dict[str, Any]:
    assert r.status_code == 400, r.text[:500]
    assert r.headers["content-type"].startswith("application/json"), r.headers  # not a stream
    err: dict[str, Any] = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    for needle in needles:
        assert needle in err["message"], err["message"]
    return err


@pytest.mark.parametrize("kind", ["transformers", pytest.param("llamacpp", marks=pytest.mark.slow)])
def test_what_cannot_fit_is_refused_before_any_stream_opens(kind: str, tiny_tokenizer: Any) -> None:
    backend = served(kind, tiny_tokenizer)
    n_question = backend.prompt_length([{"role": "user", "content": QUESTION}])
    assert n_question < WINDOW // 4
    room = WINDOW - n_question
    with BackgroundServer(build_app(backend)) as srv:
        chat, legacy = f"{srv.base_url}/chat/completions", f"{srv.base_url}/completions"
        for stream in (False, True):
            # a prompt that fills the window
            r = httpx.post(chat, json=body(LONG, max_tokens=4, stream=stream), timeout=120)
            assert_json_400(r, "context window is 256 tokens", "shorten the prompt")
            r = httpx.post(legacy, json={"prompt": LONG, "max_tokens": 4, "stream": stream}, timeout=120)
            assert_json_400(r, "context window is 256 tokens")
            # a max_tokens that does not fit after the prompt: both numbers and the most that fits
            r = httpx.post(chat, json=body(QUESTION, max_tokens=room + 1, stream=stream), timeout=120)
            err = assert_json_400(
                r, f"max_tokens={room + 1} does not fit", f"the prompt takes {n_question}", f"max_tokens <= {room}"
            )
            assert err["param"] == "max_tokens"
            r = httpx.post(chat, json=body(QUESTION, max_completion_tokens=room + 7, stream=stream), timeout=120)
            assert assert_json_400(r, f"{n_question} + {room + 7} > {WINDOW}")["param"] == "max_completion_tokens"
        # what fits exactly is answered
        r = httpx.post(chat, json=body(QUESTION, max_tokens=room), timeout=300)
        assert r.status_code == 200, r.text[:500]
        assert r.json()["usage"]["prompt_tokens"] == n_question


def test_a_default_max_tokens_is_cut_to_what_fits(tiny_tokenizer: Any) -> None:
    """A request that sends no ``max_tokens`` gets at most what fits after its prompt (the default is not its ask)."""
    from logtoku_guard.errors import PromptTooLongError
    from logtoku_guard.server import ServerSettings
    from logtoku_guard.server.wire import Limits

    backend = tiny_served(tiny_tokenizer, max_positions=WINDOW)
    for reps in range(40, 0, -1):  # the longest prompt that leaves fewer than 200 tokens of room
        prompt = "The ferry left at noon. " * reps + QUESTION
        try:
            n = backend.prompt_length([{"role": "user", "content": prompt}])
        except PromptTooLongError:
            continue
        if n < WINDOW - 8:
            break
    assert WINDOW - 80 < n < WINDOW - 8
    settings = ServerSettings(limits=Limits(max_tokens=200, default_max_tokens=200))  # 200 would not fit
    with BackgroundServer(build_app(backend, settings=settings)) as srv:
        for stream in (False, True):
            r = httpx.post(f"{srv.base_url}/chat/completions", json=body(prompt, stream=stream), timeout=300)
            assert r.status_code == 200, r.text[:500]
    assert "error" not in r.text
