"""Shared helpers of the CLI tests: wide, colourless consoles (so literal text is not wrapped) and
stored records carrying console-injection strings. Imported by name (a conftest.py here would
clash with the root conftest.py as the module ``conftest``)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from logtoku_guard import ScriptedBackend
from logtoku_guard.audit import AuditRecord
from logtoku_guard.cli import _common
from logtoku_guard.types import DecodingOptions, to_messages

INJECTIONS = {
    "close_tag": "What is [/x] this?",
    "link": "Click [link=https://evil.example]here[/link] please",
    "clear": "before\x1b[2Jafter",
    "osc8": "see \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ now",
    "cr": "visible\rHIDDEN",
    "bidi": "abc\u202edcb",
}


class CliBackend(ScriptedBackend):
    """A scripted backend with what the CLI reads from a TransformersBackend (evidence, system=)."""

    @property
    def evidence(self) -> str:
        return self._evidence

    def generate(self, prompt: Any, options: DecodingOptions | None = None, system: str | None = None) -> Any:
        return super().generate(to_messages(prompt, system), options)


def scripted_loader(answer: Any, calls: list[tuple[str, int, str]] | None = None) -> Any:
    """A stand-in for ``_common.load_backend``: a :class:`CliBackend` named after ``--model`` that
    answers with ``answer`` (a ScriptedAnswer, or a function of the messages); records each load."""

    def load(
        model: str,
        k: int,
        device: str,
        dtype: str,
        cache_dir: Any,
        evidence: str = "clamped",
        top_n: int = 25,
        backend: str = "transformers",
    ) -> Any:
        if calls is not None:
            calls.append((model, k, evidence))
        script = answer if callable(answer) else (lambda _messages: answer)
        return CliBackend(script, k=k, evidence=evidence, top_n=top_n, model_name=model)  # type: ignore[arg-type]

    return load


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "out", Console(width=1000, color_system=None))
    monkeypatch.setattr(_common, "err", Console(width=1000, color_system=None, stderr=True))


def make_record(**changes: Any) -> AuditRecord:
    fields: dict[str, Any] = {
        "model": "tiny",
        "policy_name": "p",
        "policy_version": "1",
        "prompt": "q",
        "answer": "Paris.",
        "action": "human_review",
        "reason": "max_eu 0.9 > 0.5",
        "rule": "lost",
        "reliability": -0.5,
        "tokens": [{"token": "Paris", "quadrant": "I"}, {"token": ".", "quadrant": "III"}],
    }
    fields.update(changes)
    return AuditRecord(**fields)
