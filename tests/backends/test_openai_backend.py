"""OpenAICompatibleBackend on recorded vLLM-shaped responses (tests/data/vllm/), through a mock transport."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend  # noqa: E402
from logtoku_guard.errors import ConfigurationError, LogProbsNotLogitsError, RemoteServerError  # noqa: E402
from logtoku_guard.scoring.uncertainty import rescore  # noqa: E402
from logtoku_guard.types import DecodingOptions  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm"
URL = "http://vllm.test:8000/v1"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def backend(payload: str, status: int = 200, seen: list[Any] | None = None, **kwargs: Any) -> OpenAICompatibleBackend:
    def handler(request: Any) -> Any:
        if seen is not None:
            seen.append(json.loads(request.content))
        ctype = "text/event-stream" if payload.startswith("data:") else "application/json"
        return httpx.Response(status, text=payload, headers={"content-type": ctype})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    return OpenAICompatibleBackend(URL, MODEL, client=client, **kwargs)


def test_raw_logits_response_is_scored_with_the_local_maths() -> None:
    seen: list[Any] = []
    b = backend((DATA / "chat_raw_logits.json").read_text(), seen=seen)
    g = b.generate("What is the capital of France?", DecodingOptions(max_new_tokens=2))
    assert seen[0]["logprobs"] is True and seen[0]["top_logprobs"] == 2 and seen[0]["temperature"] == 0.0
    assert g.text == "Paris is" and [t.text for t in g.tokens] == ["Paris", " is"]
    assert g.finish_reason == "length" and g.prompt_tokens == 31 and g.model == MODEL
    expected = rescore([[24.125, 17.5], [19.0, 18.75]])
    assert [t.au for t in g.tokens] == pytest.approx(expected.au.tolist(), abs=1e-12)
    assert [t.eu for t in g.tokens] == pytest.approx(expected.eu.tolist(), abs=1e-12)
    # logprob/entropy: under the top-K softmax (the wire has no more); ids unknown (-1).
    t0 = g.tokens[0]
    lse = math.log(math.exp(24.125) + math.exp(17.5))
    assert t0.logprob == pytest.approx(24.125 - lse) and t0.id == -1 and t0.top_ids == (-1, -1)
    p = [math.exp(24.125 - lse), math.exp(17.5 - lse)]
    assert t0.entropy == pytest.approx(-sum(q * math.log(q) for q in p))


def test_streamed_raw_logits_response() -> None:
    b = backend((DATA / "chat_stream_raw_logits.sse").read_text())
    with b.stream("What is the capital of France?") as s:
        tokens = list(s)
    assert [t.text for t in tokens] == ["Paris", " is"]
    g = s.generation
    assert g.text == "Paris is" and g.finish_reason == "length" and g.prompt_tokens == 31
    assert [t.top_logits for t in tokens] == [(24.125, 17.5), (19.0, 18.75)]


def test_log_probability_response_is_refused() -> None:
    b = backend((DATA / "chat_logprobs_default_mode.json").read_text())
    with pytest.raises(LogProbsNotLogitsError, match="--logprobs-mode raw_logits") as info:
        b.generate("What is the capital of France?")
    assert URL in str(info.value) and isinstance(info.value, ConfigurationError)


def test_log_probability_stream_is_refused() -> None:
    raw = (DATA / "chat_stream_raw_logits.sse").read_text()
    logprob_stream = (
        raw.replace("24.125", "-0.0013").replace("17.5", "-6.6263").replace("19.0", "-0.5761").replace("18.75", "-0.8261")
    )
    b = backend(logprob_stream)
    with pytest.raises(LogProbsNotLogitsError, match="raw_logits"), b.stream("hi") as s:
        list(s)


def test_too_few_top_logprobs_names_the_vllm_flag() -> None:
    b = backend((DATA / "chat_raw_logits.json").read_text(), k=3)
    with pytest.raises(RemoteServerError, match="--max-logprobs"):
        b.generate("hi")


def test_server_errors_are_reported_with_their_message() -> None:
    body = json.dumps(
        {"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": None, "code": 404}}
    )
    with pytest.raises(RemoteServerError, match="HTTP 404: The model `x` does not exist"):
        backend(body, status=404).generate("hi")


def test_arguments_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="base_url"):
        OpenAICompatibleBackend("localhost:8000", MODEL)
    with pytest.raises(ConfigurationError, match="top-K"):
        OpenAICompatibleBackend(URL, MODEL, k=1)
    b = backend("{}")
    assert (b.model_name, b.k, b.evidence, b.top_n) == (MODEL, 2, "clamped", 25)
    from logtoku_guard.backends.base import Backend

    assert isinstance(b, Backend)


def test_unreachable_server() -> None:
    b = OpenAICompatibleBackend("http://127.0.0.1:9/v1", MODEL, timeout=2)
    with pytest.raises(RemoteServerError, match="cannot reach"):
        b.generate("hi")


def test_import_stays_light() -> None:
    import subprocess
    import sys

    code = "import logtoku_guard.backends.openai_compat, sys; print('httpx' in sys.modules, 'fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
