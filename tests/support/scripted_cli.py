"""A scripted stand-in for the CLI's model loading, for the core CLI's tests (``tests/cli``,
which replace ``_common.load_backend``) and the evaluation harness's (``evaluation/tests``, which
replace the public ``logtoku_guard.cli.toolkit.load_backend`` the harness calls)."""

from __future__ import annotations

from typing import Any

from logtoku_guard import ScriptedBackend
from logtoku_guard.types import DecodingOptions, to_messages


class CliBackend(ScriptedBackend):
    """A scripted backend with what the CLI reads from a TransformersBackend (evidence, system=)."""

    @property
    def evidence(self) -> str:
        return self._evidence

    def generate(self, prompt: Any, options: DecodingOptions | None = None, system: str | None = None) -> Any:
        return super().generate(to_messages(prompt, system), options)


def scripted_loader(answer: Any, calls: list[tuple[str, int, str]] | None = None, backends: list[str] | None = None) -> Any:
    """A stand-in for ``load_backend``: a :class:`CliBackend` named after ``--model`` that
    answers with ``answer`` (a ScriptedAnswer, or a function of the messages); records each load
    (``calls``: model, K, evidence; ``backends``: the ``backend`` asked for)."""

    def load(
        model: str,
        k: int,
        device: str,
        dtype: str,
        cache_dir: Any,
        evidence: str = "clamped",
        top_n: int = 25,
        backend: str = "transformers",
        base_url: str | None = None,
    ) -> Any:
        if calls is not None:
            calls.append((model, k, evidence))
        if backends is not None:
            backends.append(backend)
        script = answer if callable(answer) else (lambda _messages: answer)
        return CliBackend(script, k=k, evidence=evidence, top_n=top_n, model_name=model)  # type: ignore[arg-type]

    return load
