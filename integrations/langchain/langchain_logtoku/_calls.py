"""The settings of one ``ChatLogTokU`` call: the model's fields overridden by the call's arguments.

``invoke``/``stream`` keyword arguments (``max_tokens``, ``temperature``, ``top_k``, ``logprobs``,
``tools``, ``response_format``...) are checked here once; :class:`CallSettings` carries the core
:class:`~logtoku_guard.types.DecodingOptions` and what the metadata needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_logtoku import _convert, _structured
from langchain_logtoku import tools as _tools
from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.uncertainty import validate_k
from logtoku_guard.types import DecodingOptions


class ModelFields(Protocol):
    """What a call's settings read from the chat model (``ChatLogTokU`` has it): its fields and backend."""

    @property
    def model_name(self) -> str: ...

    @property
    def stop(self) -> list[str] | None: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def temperature(self) -> float: ...

    @property
    def top_p(self) -> float: ...

    @property
    def seed(self) -> int | None: ...

    @property
    def top_k(self) -> int | None: ...

    @property
    def logprobs(self) -> bool: ...

    @property
    def top_logprobs(self) -> int | None: ...

    @property
    def max_string_length(self) -> int | None: ...

    @property
    def core_backend(self) -> Backend: ...

    def _capacity(self, backend: Backend | None) -> int: ...


__all__ = ["CallSettings", "call_settings"]


@dataclass(frozen=True)
class CallSettings:
    """The settings of one call: fields overridden by per-call arguments, validated."""

    options: DecodingOptions
    k: int
    backend_k: int
    logprobs: bool
    top_logprobs: int
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | None = None
    schema_prompt: str | None = None  # the response_format's JSON schema, told to the model


def call_settings(llm: ModelFields, stop: list[str] | None, kwargs: dict[str, Any]) -> CallSettings:
    """The settings of one call of ``llm``: its fields overridden by the call's arguments, validated."""
    unknown, accepted = set(kwargs) - _convert.CALL_ARGS, sorted(_convert.CALL_ARGS - {"stream"})
    if legacy := unknown & _convert.LEGACY_TOOL_ARGS:
        msg = f"legacy function calling is not supported (got {sorted(legacy)}): use tool calling, bind_tools"
        raise NotImplementedError(msg)
    if unknown:
        msg = f"unknown call argument(s) {sorted(unknown)}; ChatLogTokU accepts {accepted} and stop"
        raise ConfigurationError(msg)
    model = kwargs.get("model")
    if model is not None and model != llm.model_name:
        msg = (
            f"this ChatLogTokU serves {llm.model_name!r}; model={model!r} per call is not supported: "
            "create another ChatLogTokU(model=...)"
        )
        raise ConfigurationError(msg)
    stops = llm.stop if stop is None else stop
    options = DecodingOptions(
        max_new_tokens=kwargs.get("max_tokens", llm.max_tokens),
        temperature=kwargs.get("temperature", llm.temperature),
        top_p=kwargs.get("top_p", llm.top_p),
        seed=kwargs.get("seed", llm.seed),
        stop=tuple(stops or ()),
    )
    backend_k = int(llm.core_backend.k)
    k = kwargs.get("top_k", llm.top_k)
    k = backend_k if k is None else validate_k(k)
    if k > backend_k:
        msg = f"top_k={k} exceeds the backend's K={backend_k}; build the model with top_k >= {k}"
        raise ConfigurationError(msg)
    top_lp = kwargs.get("top_logprobs", llm.top_logprobs)
    logprobs = bool(kwargs.get("logprobs", llm.logprobs)) or top_lp is not None
    bound = tuple(convert_to_openai_tool(t) for t in kwargs.get("tools") or ())
    choice = _tools.tool_choice_name(kwargs.get("tool_choice"), _tools.names(bound))
    fmt, cap = kwargs.get("response_format"), llm.max_string_length
    options, note = _structured.constrained(options, fmt, bound, choice, llm.core_backend, cap)
    return CallSettings(
        options=options,
        k=k,
        backend_k=backend_k,
        logprobs=logprobs,
        top_logprobs=0 if top_lp is None else _convert.check_top_logprobs(top_lp, k, llm._capacity(llm.core_backend)),
        tools=bound if choice != "none" else (),
        tool_choice=choice,
        schema_prompt=note,
    )
