"""What a request that leaves out ``temperature`` or ``max_tokens`` gets (issue 44 item 3).

By default what the guard was calibrated on, not OpenAI's defaults: greedy (temperature 0) with the
answer length the served profile's guard was fitted on (its ``max_tokens``), else ``ask``'s 64
tokens, for ``/v1/chat/completions`` and the legacy ``/v1/completions`` alike (as vLLM takes
omitted sampling parameters from the model's generation config). Sampled at OpenAI's temperature 1
the shipped guard flags 179 of 180 answers (docs/SERVING.md). ``serve --default-temperature 1
--default-max-tokens 256`` gives OpenAI's defaults back; a field the request sends always wins; the
startup line says which defaults are in force and why.
"""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from support.served import tiny_served  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from logtoku_guard.errors import ConfigurationError  # noqa: E402
from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402
from logtoku_guard.server.limits import CALIBRATION_MAX_TOKENS, calibrated_max_tokens  # noqa: E402
from logtoku_guard.server.settings import ServerSettings  # noqa: E402
from logtoku_guard.server.wire import Limits, decoding_options  # noqa: E402
from logtoku_guard.wire import openai_protocol as proto  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
OPENAI = Limits(default_temperature=1.0, default_max_tokens=256)
"""What ``serve --default-temperature 1 --default-max-tokens 256`` builds: OpenAI's defaults."""


def _chat(**fields: Any) -> proto.ChatCompletionRequest:
    return proto.ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})


def _completion(**fields: Any) -> proto.CompletionRequest:
    return proto.CompletionRequest.model_validate({"prompt": PROMPT, **fields})


def _decoded(options: Any) -> tuple[float, int]:
    return options.temperature, options.max_new_tokens


def test_omitted_fields_are_decoded_as_the_guard_was_calibrated_on_both_endpoints() -> None:
    assert CALIBRATION_MAX_TOKENS == 64  # ask's --max-new-tokens and calibrate's, what the shipped guards were fit on
    for request in (_chat, _completion):
        assert _decoded(decoding_options(request(), Limits())) == (0.0, 64)  # greedy, 64 tokens (was: T=1, 256 or 16)
        assert _decoded(decoding_options(request(), Limits(calibrated_max_tokens=100))) == (0.0, 100)  # the profile's
        assert _decoded(decoding_options(request(), Limits(max_tokens=32))) == (0.0, 32)  # never above --max-tokens
        assert _decoded(decoding_options(request(), OPENAI)) == (1.0, 256)  # the flags give OpenAI's back
        sent = request(temperature=0.7, max_tokens=10)
        for limits in (Limits(), OPENAI):
            assert _decoded(decoding_options(sent, limits)) == (0.7, 10)  # what the request sends wins
    assert _decoded(decoding_options(_chat(max_completion_tokens=12, temperature=0), OPENAI)) == (0.0, 12)


def _shipped_profile() -> Any:
    from logtoku_guard.calibration.profiles import ModelProfile, shipped_profile_path

    return ModelProfile.load(shipped_profile_path("smollm2-135m-instruct", 2, "clamped"))


def test_the_calibrated_length_is_the_profiles_guard_else_asks() -> None:
    from logtoku_guard.calibration.guard_fit import shipped_guard

    shipped = _shipped_profile()
    assert shipped.guard is not None and shipped.guard.max_tokens == 64
    assert calibrated_max_tokens(shipped) == 64
    guard = shipped_guard("smollm2-135m-instruct")
    assert guard is not None
    fitted_on_7 = shipped.model_copy(update={"guard": guard.model_copy(update={"max_tokens": 7})})
    assert calibrated_max_tokens(fitted_on_7) == 7
    unbounded = shipped.model_copy(update={"guard": guard.model_copy(update={"max_tokens": None})})
    assert calibrated_max_tokens(unbounded) == CALIBRATION_MAX_TOKENS
    assert calibrated_max_tokens(shipped.model_copy(update={"guard": None})) == CALIBRATION_MAX_TOKENS
    assert calibrated_max_tokens(None) == CALIBRATION_MAX_TOKENS


@pytest.mark.parametrize("bad", [-0.5, math.inf, math.nan])
def test_a_default_temperature_that_is_not_a_temperature_is_refused(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="--default-temperature"):
        Limits(default_temperature=bad)


def test_a_calibrated_length_that_is_not_a_length_is_refused() -> None:
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ConfigurationError, match="calibrated_max_tokens"):
            Limits(calibrated_max_tokens=bad)  # type: ignore[arg-type]


def _post(srv: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(srv.base_url + path, json=body, timeout=300)
    assert r.status_code == 200, r.text[:500]
    out: dict[str, Any] = r.json()
    return out


def _ids(body: dict[str, Any], chat: bool) -> list[Any]:
    """The chosen token ids of a response asked with log-probabilities (the ``logtoku`` extension)."""
    choice = body["choices"][0]
    if chat:
        return [t["logtoku"]["id"] for t in choice["logprobs"]["content"]]
    return [t["id"] for t in choice["logprobs"]["logtoku"]]


def _text(body: dict[str, Any], chat: bool) -> str:
    choice = body["choices"][0]
    return str(choice["message"]["content"] if chat else choice["text"])


def test_a_request_without_them_is_answered_as_an_explicit_greedy_calibrated_one(tiny_tokenizer: Any) -> None:
    """At the server's defaults (no flags) a bare request gets the very answer of ``temperature 0,
    max_tokens 64``, chat and legacy completions alike; under OpenAI's defaults it was sampled at
    temperature 1 with up to 256 tokens (completions: 16)."""
    backend = tiny_served(tiny_tokenizer)
    with BackgroundServer(build_app(backend, settings=ServerSettings())) as srv:
        for path, chat, base in (
            ("/chat/completions", True, {"messages": MESSAGES, "logprobs": True}),
            ("/completions", False, {"prompt": PROMPT, "logprobs": 1}),
        ):
            bare = _post(srv, path, base)
            greedy = _post(srv, path, {**base, "temperature": 0, "max_tokens": 64})
            assert _ids(bare, chat) == _ids(greedy, chat) and _text(bare, chat) == _text(greedy, chat)
            assert bare["usage"]["completion_tokens"] == greedy["usage"]["completion_tokens"] <= 64
            # the tiny random model runs to the limit: 64 tokens, neither OpenAI's 256 (chat) nor its 16 (legacy)
            assert bare["usage"]["completion_tokens"] == 64, bare["usage"]
            # a field the request sends wins over the default
            short = _post(srv, path, {**base, "max_tokens": 5})
            assert _ids(short, chat) == _ids(greedy, chat)[:5]


ALWAYS_WARN = {
    "name": "always-warn",
    "rules": [{"name": "any", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": "warn"}],
}


def _fitted_on_7(backend: Any) -> Any:
    """A profile of ``backend`` whose guard records that it was fitted on 7-token answers."""
    from logtoku_guard.calibration.guard_fit import shipped_guard
    from logtoku_guard.calibration.profiles import calibrate
    from logtoku_guard.types import DecodingOptions

    guard = shipped_guard("smollm2-135m-instruct")
    assert guard is not None
    seven = guard.model_copy(update={"max_tokens": 7})
    return calibrate(backend, ["q one?", "q two?", "q three?"], DecodingOptions(max_new_tokens=7), guard=seven)


def test_the_profile_the_guard_was_fitted_on_sets_the_omitted_length(tiny_tokenizer: Any) -> None:
    """A profile whose guard was fitted on 7-token answers: a request without ``max_tokens`` gets 7, greedy."""
    from logtoku_guard.decision.policy import Policy

    backend = tiny_served(tiny_tokenizer)
    app = build_app(backend, policy=Policy.from_dict(ALWAYS_WARN), profile=_fitted_on_7(backend))
    assert app.state.serving.limits.omitted_max_tokens == 7
    with BackgroundServer(app) as srv:
        bare = _post(srv, "/chat/completions", {"messages": MESSAGES, "logprobs": True})
        greedy = _post(srv, "/chat/completions", {"messages": MESSAGES, "logprobs": True, "temperature": 0, "max_tokens": 7})
    assert bare["usage"]["completion_tokens"] == 7 and _ids(bare, True) == _ids(greedy, True)
    assert bare["choices"][0]["logtoku_guard"]["action"] == "warn"


def test_openais_defaults_come_back_with_the_flags(tiny_tokenizer: Any) -> None:
    """``--default-temperature 1 --default-max-tokens 256``: a bare request is sampled at 1 with up to 256
    tokens, the answer of the same request sent with ``temperature 1, max_tokens 256``."""
    backend = tiny_served(tiny_tokenizer)
    with BackgroundServer(build_app(backend, settings=ServerSettings(limits=OPENAI))) as srv:
        bare = _post(srv, "/chat/completions", {"messages": MESSAGES, "logprobs": True, "seed": 7})
        sampled = _post(
            srv, "/chat/completions", {"messages": MESSAGES, "logprobs": True, "seed": 7, "temperature": 1, "max_tokens": 256}
        )
        greedy = _post(srv, "/chat/completions", {"messages": MESSAGES, "logprobs": True, "temperature": 0, "max_tokens": 256})
    assert _ids(bare, True) == _ids(sampled, True) != _ids(greedy, True)
    assert bare["usage"]["completion_tokens"] > 64


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _serve(monkeypatch: pytest.MonkeyPatch, backend: Any, *args: str) -> tuple[str, Any]:
    """``serve`` run to its startup line on ``backend`` (the model loader and the serving loop replaced)."""
    from logtoku_guard.backends import registry
    from logtoku_guard.cli import app
    from logtoku_guard.server import run

    served: list[Any] = []
    monkeypatch.setattr(registry, "create_backend", lambda name, settings: backend)
    monkeypatch.setattr(run, "serve_app", lambda app_, settings, sock: served.append(app_))
    res = CliRunner().invoke(app, ["serve", "--port", _free_port(), *args])
    assert res.exit_code == 0 and len(served) == 1, res.output
    return " ".join(res.output.split()), served[0].state.serving.limits


def test_the_startup_line_states_the_defaults_in_force_and_why(monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Any) -> None:
    backend = tiny_served(tiny_tokenizer)
    line, limits = _serve(monkeypatch, backend)
    assert (limits.default_temperature, limits.omitted_max_tokens) == (0.0, 64)
    assert "no temperature or max_tokens gets temperature 0 (greedy), as ask answers and the guard was calibrated" in line
    assert "up to 64 tokens, the length ask answers with" in line
    assert "--default-temperature 1 --default-max-tokens 256 for OpenAI's defaults" in line, line
    line, limits = _serve(monkeypatch, backend, "--default-temperature", "1", "--default-max-tokens", "256")
    assert (limits.default_temperature, limits.omitted_max_tokens) == (1.0, 256)
    assert "gets temperature 1 (sampled) from --default-temperature and up to 256 tokens from --default-max-tokens" in line
    assert "for OpenAI's defaults" not in line, line
    line, limits = _serve(monkeypatch, backend, "--max-tokens", "32")
    assert limits.omitted_max_tokens == 32 and "up to 32 tokens (--max-tokens; ask answers with 64)" in line, line


def test_serve_takes_the_omitted_length_from_its_profile(
    monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """``serve --profile`` (with a policy, or without one) decodes an omitted ``max_tokens`` with the length
    that profile's guard was fitted on, and its startup line says so."""
    import json

    backend = tiny_served(tiny_tokenizer)
    profile = _fitted_on_7(backend).save(tmp_path / "profile.json")
    policy = tmp_path / "always-warn.json"
    policy.write_text(json.dumps(ALWAYS_WARN), encoding="utf-8")
    for guarded in ([], ["--policy", str(policy)]):
        line, limits = _serve(monkeypatch, backend, "--model", "tiny", "--profile", str(profile), *guarded)
        assert (limits.default_temperature, limits.omitted_max_tokens) == (0.0, 7), guarded
        assert "up to 7 tokens, the length the profile's guard was fitted on" in line, line


def test_the_startup_line_names_the_profiles_length() -> None:
    from logtoku_guard.cli.serve import defaults_line

    profile = _shipped_profile()
    assert profile.guard is not None
    limits = Limits(calibrated_max_tokens=calibrated_max_tokens(profile))
    line = defaults_line(limits, temperature_given=False, profile=profile)
    assert "up to 64 tokens, the length the profile's guard was fitted on" in line, line
    n = 128  # a guard fitted on longer answers
    fitted = profile.model_copy(update={"guard": profile.guard.model_copy(update={"max_tokens": n})})
    line = defaults_line(Limits(calibrated_max_tokens=calibrated_max_tokens(fitted)), False, fitted)
    assert f"up to {n} tokens, the length the profile's guard was fitted on" in line, line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--default-max-tokens", "2000", "--max-tokens", "1024"], "--default-max-tokens must be from 1 to --max-tokens (1024)"),
        (["--default-max-tokens", "0"], "--default-max-tokens must be from 1"),
        (["--default-temperature", "-1"], "--default-temperature must be a finite number >= 0"),
    ],
)
def test_serve_refuses_bad_defaults_before_loading_a_model(args: list[str], needle: str) -> None:
    from logtoku_guard.cli import app

    res = CliRunner().invoke(app, ["serve", "--model", "/nonexistent/model", "--port", _free_port(), *args])
    assert res.exit_code == 2 and needle in res.output, res.output
