"""Constrained tool calls and structured output through ChatLogTokU, on the tiny random model."""

from __future__ import annotations

from typing import Annotated, Any

import pytest

pytest.importorskip("llguidance")

from langchain_core.tools import tool
from pydantic import BaseModel, Field
from support.tiny import make_model

from langchain_logtoku import ChatLogTokU
from logtoku_guard.errors import ConfigurationError


# Bounded values: a random model ends a string only when it happens to pick '"'.
@tool
def transfer(amount: Annotated[int, Field(ge=0, le=999)], to: Annotated[str, Field(max_length=6)]) -> str:
    """Send money."""
    return "done"


@tool
def ping() -> str:
    """Check the line."""
    return "pong"


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=120)


@pytest.fixture
def tiny_backend(tiny_tokenizer: Any) -> Any:
    """The tiny random model with room for the tool prompt (its bytes-level tokenizer spends ~500 tokens on it)."""
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend("tiny", model_obj=make_model(tiny_tokenizer, max_positions=1024), tokenizer=tiny_tokenizer)


STATS = {"tokens", "mean_au", "mean_eu", "max_au", "max_eu", "logprob"}


@pytest.mark.parametrize("choice", ["any", "required", "transfer"])
def test_a_forced_choice_always_gives_a_valid_scored_call(tiny_backend: Any, choice: str) -> None:
    llm = ChatLogTokU(backend=tiny_backend, max_tokens=120).bind_tools([transfer, ping], tool_choice=choice)
    for question in ("Send 5 to Bob.", "What is the capital of France?"):
        message = llm.invoke(question)
        assert len(message.tool_calls) == 1 and not message.invalid_tool_calls, message.content
        call = message.tool_calls[0]
        if choice == "transfer":
            assert call["name"] == "transfer"
        (scored,) = message.response_metadata["logtoku"]["tool_calls"]
        assert (scored["id"], scored["name"]) == (call["id"], call["name"])
        assert set(scored["arguments"]) == set(call["args"])
        for stats in scored["arguments"].values():
            assert set(stats) == STATS and stats["tokens"] >= 1 and stats["logprob"] <= 0


def test_a_streamed_forced_call_carries_the_same_metadata(tiny_backend: Any) -> None:
    llm = ChatLogTokU(backend=tiny_backend, max_tokens=120).bind_tools([transfer], tool_choice="transfer")
    full = None
    for chunk in llm.stream("Send 5 to Bob."):
        full = chunk if full is None else full + chunk
    assert full is not None and full.tool_calls[0]["name"] == "transfer"
    assert full.response_metadata["logtoku"]["tool_calls"][0]["id"] == full.tool_calls[0]["id"]


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_structured_output_parses_on_a_random_model(tiny_backend: Any, method: str) -> None:
    llm = ChatLogTokU(backend=tiny_backend, max_tokens=80)
    schema: Any = Person if method != "json_mode" else {"title": "Anything", "type": "object"}
    result = llm.with_structured_output(schema, method=method).invoke("Who is Ada?")  # type: ignore[arg-type]
    if method == "json_mode":
        assert isinstance(result, dict)
    else:
        assert isinstance(result, Person)


def test_structured_output_rejects_an_unknown_method(tiny_backend: Any) -> None:
    with pytest.raises(ConfigurationError, match="method must be one of"):
        ChatLogTokU(backend=tiny_backend).with_structured_output(Person, method="xml")


def test_response_format_needs_a_schema(tiny_backend: Any) -> None:
    with pytest.raises(ConfigurationError, match="response_format must be"):
        ChatLogTokU(backend=tiny_backend).invoke("hi", response_format="json")


class Note(BaseModel):
    """Fields without a length bound: a random model ends them only by chance."""

    title: str
    body: str


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_max_string_length_lets_unbounded_strings_end(tiny_backend: Any, method: str) -> None:
    llm = ChatLogTokU(backend=tiny_backend, max_tokens=200, max_string_length=4)
    raw = llm.with_structured_output(Note, method=method, include_raw=True).invoke("Write a note.")
    assert isinstance(raw["parsed"], Note) and raw["raw"].response_metadata["finish_reason"] == "stop"
    assert len(raw["parsed"].title) <= 4 and len(raw["parsed"].body) <= 4


def test_max_string_length_is_checked() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="max_string_length"):
        ChatLogTokU(max_string_length=0)


def test_structured_schemas_take_their_declared_fields_only() -> None:
    from langchain_logtoku._structured import closed

    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}, "$defs": {"B": {"properties": {}}}}
    out = closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["$defs"]["B"]["additionalProperties"] is False and "additionalProperties" not in schema
    assert closed({"properties": {}, "additionalProperties": True})["additionalProperties"] is True  # said so: kept
