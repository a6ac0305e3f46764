"""torch intra-op threads: ``threads=`` / ``$LOGTOKU_GUARD_THREADS`` / the default, applied while generating."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from support.tiny import make_model

from logtoku_guard.backends.transformers import THREADS_ENV, TransformersBackend, default_threads
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.types import DecodingOptions


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_default_is_one_thread_on_two_cpus_and_half_the_cpus_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    for cpus, expected in [(1, 1), (2, 1), (4, 2), (16, 8), (64, 8)]:
        monkeypatch.setattr("os.cpu_count", lambda cpus=cpus: cpus)
        assert default_threads() == expected


def test_argument_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3
    assert default_threads(2) == 2
    monkeypatch.setenv(THREADS_ENV, "0")
    assert default_threads() is None  # 0: leave torch's own setting
    assert default_threads(0) is None
    monkeypatch.setenv(THREADS_ENV, " ")
    assert default_threads(5) == 5


@pytest.mark.parametrize("bad", ["two", "1.5"])
def test_a_bad_environment_value_is_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(THREADS_ENV, bad)
    with pytest.raises(ConfigurationError, match=THREADS_ENV):
        default_threads()


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_a_bad_argument_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="threads"):
        default_threads(bad)


def test_the_backend_generates_with_its_threads(tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    model = make_model(tiny_tokenizer)
    model.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    torch.set_num_threads(2)
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, threads=1)
    assert backend.threads == 1
    backend.generate("Hi", DecodingOptions(max_new_tokens=2))
    assert seen and set(seen) == {1}
    monkeypatch.setenv(THREADS_ENV, "0")
    untouched = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    assert untouched.threads is None


def test_the_serve_command_takes_threads() -> None:
    pytest.importorskip("typer")
    import inspect

    from logtoku_guard.cli.serve import serve

    assert "threads" in inspect.signature(serve).parameters
