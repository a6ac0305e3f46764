"""The one backend registry: built-in backends by name, settings a backend cannot honour refused, a
new backend added by registering it (nothing else), and every backend naming its provider."""

from __future__ import annotations

from typing import Any

import pytest

from logtoku_guard.backends import registry
from logtoku_guard.backends.base import ScoringIdentity, provider_of
from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
from logtoku_guard.backends.registry import BackendSettings, backend_names, create_backend, register_backend
from logtoku_guard.errors import ConfigurationError


def test_the_built_in_backends_are_registered() -> None:
    assert backend_names()[:3] == ("transformers", "llamacpp", "openai")


def test_an_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown backend 'vllm'.*transformers, llamacpp, openai"):
        create_backend("vllm")


def test_a_setting_the_backend_cannot_honour_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigurationError, match=r"llamacpp backend does not take base_url='http://x/v1'"):
        create_backend("llamacpp", base_url="http://x/v1")
    with pytest.raises(ConfigurationError, match=r"openai backend does not take device='cuda'"):
        create_backend("openai", BackendSettings(device="cuda", base_url="http://127.0.0.1:9/v1"))
    with pytest.raises(ConfigurationError, match=r"device='cuda' apply to the transformers backend"):
        create_backend("llamacpp", device="cuda")
    with pytest.raises(ConfigurationError, match=r"unknown backend setting\(s\) temperature"):
        create_backend("transformers", temperature=0.5)


def test_the_openai_backend_needs_an_address_and_reads_its_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="--base-url"):
        create_backend("openai", model="m")
    monkeypatch.delenv("LOGTOKU_GUARD_REMOTE_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "from-openai-env")
    assert registry.remote_api_key() == "from-openai-env"
    monkeypatch.setenv("LOGTOKU_GUARD_REMOTE_API_KEY", "ours-first")
    assert registry.remote_api_key() == "ours-first"
    backend = create_backend("openai", model="m", base_url="http://127.0.0.1:9/v1", k=3)
    try:
        assert (backend.model_name, backend.k, backend.evidence, provider_of(backend)) == ("m", 3, "clamped", "openai")
        assert backend._headers == {"Authorization": "Bearer ours-first"}  # type: ignore[attr-defined]
    finally:
        backend.close()  # type: ignore[attr-defined]


def test_the_transformers_backend_is_built_from_settings(tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The factory passes every given setting through (the tiny model stands in for a download)."""
    from support.tiny import make_model

    from logtoku_guard.backends import transformers as tf_module

    seen: dict[str, Any] = {}
    real = tf_module.TransformersBackend

    def fake(model: Any, **kwargs: Any) -> Any:
        seen.update(kwargs, model=model)
        return real("tiny", model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer, k=kwargs["k"], top_n=kwargs["top_n"])

    monkeypatch.setattr(tf_module, "TransformersBackend", fake)
    backend = create_backend("transformers", BackendSettings(model="some/model", k=3, top_n=4, max_batch=2, threads=1))
    assert seen["model"] == "some/model" and seen["max_batch"] == 2 and seen["threads"] == 1
    assert "device" not in seen and "prefill_chunk" not in seen  # not given: the backend's own default
    assert (backend.k, backend.top_n, provider_of(backend)) == (3, 4, "transformers")


class EchoBackend(ScriptedBackend):
    """A backend added in a test: its module (this class), its registration, its tests; nothing else."""

    provider = "echo-provider"


def _build_echo(settings: BackendSettings) -> EchoBackend:
    settings.refuse("echo", "device", "dtype", "base_url")
    answer = ScriptedAnswer(["echo"], [(2.0, 1.0)])
    return EchoBackend([answer] * 8, k=settings.k, model_name=settings.model or "echo-model")


def test_a_registered_backend_reaches_the_cli_and_the_guards_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    register_backend("echo", _build_echo)
    with pytest.raises(ConfigurationError, match="registered already"):
        register_backend("echo", _build_echo)
    result = CliRunner().invoke(app, ["score", "--backend", "echo", "--json", "Say something."])
    assert result.exit_code == 0, result.output
    assert '"echo"' in result.output or "echo" in result.output
    refused = CliRunner().invoke(app, ["score", "--backend", "echo", "--device", "cuda", "Hi"])
    assert refused.exit_code != 0 and "echo backend does not take device='cuda'" in refused.output


@pytest.mark.parametrize(
    ("backend_class", "provider"),
    [
        ("transformers.TransformersBackend", "transformers"),
        ("llamacpp.LlamaCppBackend", "llama.cpp"),
        ("openai_compat.OpenAICompatibleBackend", "openai"),
        ("fake.ScriptedBackend", "logtoku_guard"),
    ],
)
def test_every_backend_class_names_its_provider(backend_class: str, provider: str) -> None:
    import importlib

    module, name = backend_class.split(".")
    cls = getattr(importlib.import_module(f"logtoku_guard.backends.{module}"), name)
    assert issubclass(cls, ScoringIdentity) and cls.provider == provider


def test_a_wrapper_forwards_its_backends_provider() -> None:
    import threading

    from logtoku_guard.server.engine import CancellableBackend

    inner = EchoBackend([ScriptedAnswer(["x"], [(2.0, 1.0)])])
    assert provider_of(CancellableBackend(inner, threading.Event())) == "echo-provider"
    assert provider_of(object()) is None


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ({"max_batch": 0}, r"--max-batch must be at least 1, got 0"),
        ({"max_batch": True}, r"--max-batch must be at least 1, got True"),
        ({"prefix_cache_mb": -1}, r"--prefix-cache-mb must be >= 0 \(0 disables prefix caching\), got -1"),
        ({"prefill_chunk": 64}, r"--prefill-chunk must be at least 128 tokens \(0: prefill prompts whole\), got 64"),
        ({"prefill_chunk": 200.0}, r"--prefill-chunk must be at least 128 tokens .*got 200\.0"),
    ],
    ids=["max-batch-0", "max-batch-bool", "prefix-cache-negative", "prefill-chunk-small", "prefill-chunk-float"],
)
def test_the_batching_settings_are_checked_when_the_settings_are_made(
    setting: dict[str, Any], needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve``'s --max-batch, --prefix-cache-mb and --prefill-chunk are checked by BackendSettings,
    before any factory (any model load) runs, whether given as settings or as create_backend's overrides."""
    built: list[BackendSettings] = []
    monkeypatch.setitem(registry._FACTORIES, "transformers", built.append)
    with pytest.raises(ConfigurationError, match=needle):
        BackendSettings(**setting)
    with pytest.raises(ConfigurationError, match=needle):
        create_backend("transformers", **setting)
    assert not built


def test_the_batching_settings_accept_their_edges() -> None:
    edges = BackendSettings(max_batch=1, prefix_cache_mb=0, prefill_chunk=0)
    assert (edges.max_batch, edges.prefix_cache_mb, edges.prefill_chunk) == (1, 0, 0)
    assert BackendSettings(prefill_chunk=128).prefill_chunk == 128
    assert BackendSettings().given("max_batch", "prefix_cache_mb", "prefill_chunk") == {}
