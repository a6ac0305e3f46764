"""What a request that leaves out ``temperature`` or ``max_tokens`` gets (issue 44 item 3).

By default OpenAI's: temperature 1 (sampled) and, for a chat request, up to 256 tokens.
``serve --default-temperature 0 --default-max-tokens 64`` makes an omitted field mean ``ask``'s
decoding (greedy, 64 tokens), what every shipped profile and guard were calibrated on. A field the
request sends always wins.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from support.served import tiny_served  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from logtoku_guard.errors import ConfigurationError  # noqa: E402
from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402
from logtoku_guard.server.settings import ServerSettings  # noqa: E402
from logtoku_guard.server.wire import Limits, decoding_options  # noqa: E402
from logtoku_guard.wire import openai_protocol as proto  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def _chat(**fields: Any) -> proto.ChatCompletionRequest:
    return proto.ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})


def test_omitted_fields_get_openais_defaults_unless_the_server_says_otherwise() -> None:
    openai = decoding_options(_chat(), Limits())
    assert (openai.temperature, openai.max_new_tokens) == (1.0, 256)
    greedy = decoding_options(_chat(), Limits(default_max_tokens=64, default_temperature=0.0))
    assert (greedy.temperature, greedy.max_new_tokens) == (0.0, 64)
    sent = decoding_options(_chat(temperature=0.7, max_tokens=10), Limits(default_max_tokens=64, default_temperature=0.0))
    assert (sent.temperature, sent.max_new_tokens) == (0.7, 10)  # what the request sends wins


@pytest.mark.parametrize("bad", [-0.5, math.inf, math.nan])
def test_a_default_temperature_that_is_not_a_temperature_is_refused(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="--default-temperature"):
        Limits(default_temperature=bad)


def test_the_server_applies_its_defaults_to_a_request_without_them(tiny_tokenizer: Any) -> None:
    backend = tiny_served(tiny_tokenizer)
    settings = ServerSettings(limits=Limits(default_max_tokens=5, default_temperature=0.0))
    with BackgroundServer(build_app(backend, settings=settings)) as srv:
        bare = httpx.post(srv.base_url + "/chat/completions", json={"messages": MESSAGES}, timeout=120).json()
        greedy = httpx.post(
            srv.base_url + "/chat/completions", json={"messages": MESSAGES, "temperature": 0, "max_tokens": 5}, timeout=120
        ).json()
    assert bare["usage"]["completion_tokens"] <= 5
    assert bare["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--default-max-tokens", "2000", "--max-tokens", "1024"], "--default-max-tokens must be from 1 to --max-tokens (1024)"),
        (["--default-max-tokens", "0"], "--default-max-tokens must be from 1"),
        (["--default-temperature", "-1"], "--default-temperature must be a finite number >= 0"),
    ],
)
def test_serve_refuses_bad_defaults_before_loading_a_model(args: list[str], needle: str) -> None:
    import socket

    from logtoku_guard.cli import app

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    res = CliRunner().invoke(app, ["serve", "--model", "/nonexistent/model", "--port", port, *args])
    assert res.exit_code == 2 and needle in res.output, res.output
