"""Structured output and constrained tool calls for ``ChatLogTokU``.

- :func:`tool_constraint`: bound tools and ``tool_choice`` as a core
  :class:`~logtoku_guard.tools.constraints.ToolCalls` (``"any"``/a name: the whole answer is one
  call; ``None``/``"auto"``: prose, or a call constrained once it opens).
- :func:`response_constraint`: a ``response_format`` call argument (``{"type": "json_schema",
  "json_schema": {"schema": ...}}``, ``{"type": "json_object"}``, or a bare JSON Schema) as a
  :class:`~logtoku_guard.tools.constraints.JsonSchema`, and :func:`schema_prompt` describing it to
  the model.
- :func:`with_structured_output`: the three LangChain methods: ``function_calling`` (a forced
  tool call, the default), ``json_schema`` and ``json_mode`` (the answer itself is the JSON),
  all decoded under a grammar (``json_mode`` with a schema: decoded under its shape too, but
  the schema is not told to the model); the schema's objects take their declared fields only
  (:func:`closed`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.pydantic import is_basemodel_subclass

from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.tools.constraints import JsonSchema, ToolCalls
from logtoku_guard.tools.tool_calls import schema_prompt
from logtoku_guard.types import DecodingOptions

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

__all__ = ["closed", "constrained", "response_constraint", "schema_prompt", "tool_constraint", "with_structured_output"]

METHODS = ("function_calling", "json_schema", "json_mode")


def tool_constraint(tools: Sequence[Mapping[str, Any]], choice: str | None, cap: int | None = None) -> ToolCalls | None:
    """The constraint of bound ``tools`` under ``choice`` (as :func:`~langchain_logtoku.tools.tool_choice_name`
    gives it); ``cap``: the ``max_string_length`` of the arguments' unbounded strings."""
    if not tools or choice == "none":
        return None
    return ToolCalls(tools, "auto" if choice is None else choice, max_string_length=cap)


def response_constraint(response_format: Any, cap: int | None = None) -> JsonSchema:
    """A ``response_format`` as a :class:`JsonSchema` (a ConfigurationError names the accepted forms);
    ``cap``: the ``max_string_length`` of its unbounded strings."""
    fmt = response_format
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_object":  # "schema": the object's shape (json_mode)
        return JsonSchema(fmt.get("schema") or {"type": "object"}, max_string_length=cap)
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, Mapping) else None
        if not isinstance(schema, Mapping):
            msg = f"response_format json_schema needs {{'json_schema': {{'schema': {{...}}}}}}, got {fmt!r:.120}"
            raise ConfigurationError(msg)
        name = inner.get("name") if isinstance(inner, Mapping) else None
        return JsonSchema(schema, name if isinstance(name, str) and name else None, max_string_length=cap)
    if isinstance(fmt, Mapping) and "type" in fmt and fmt.get("type") not in ("json_schema", "json_object"):
        return JsonSchema(fmt, max_string_length=cap)  # a bare JSON Schema ({"type": "object", ...})
    msg = (
        "response_format must be {'type': 'json_schema', 'json_schema': {'schema': {...}}}, {'type': 'json_object'} "
        f"or a JSON Schema dict, got {fmt!r:.120}"
    )
    raise ConfigurationError(msg)


def constrained(
    options: DecodingOptions,
    response_format: Any,
    tools: Sequence[Mapping[str, Any]],
    choice: str | None,
    backend: Backend,
    cap: int | None = None,
) -> tuple[DecodingOptions, str | None]:
    """``options`` with the call's constraint, and the schema text for the system turn (None: none).
    ``cap``: the constraint's ``max_string_length`` (``ChatLogTokU.max_string_length``).

    A ``response_format`` always constrains (a backend without grammars refuses it); bound
    tools constrain only on a backend that supports it (``constrained_decoding``), else the
    tool-call prompt alone asks for the format.
    """
    if response_format is not None:
        constraint = response_constraint(response_format, cap)
        told = isinstance(response_format, Mapping) and response_format.get("type") != "json_object"
        return options.replace(constraint=constraint), schema_prompt(constraint) if told else None
    calls = tool_constraint(tools, choice, cap) if getattr(backend, "constrained_decoding", False) else None
    return (options if calls is None else options.replace(constraint=calls)), None


def closed(schema: Any) -> Any:
    """A copy of ``schema`` whose objects with declared ``properties`` allow no others (unless they say
    so), as OpenAI's strict mode: the grammar then ends the object after the declared fields."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: closed(value) if key not in ("properties", "$defs", "definitions") else value for key, value in schema.items()}
    for key in ("properties", "$defs", "definitions"):
        if isinstance(out.get(key), Mapping):
            out[key] = {name: closed(item) for name, item in out[key].items()}
    if "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


def with_structured_output(
    model: BaseChatModel,
    schema: Mapping[str, Any] | type,
    method: str,
    include_raw: bool,
    function_calling: Callable[..., Runnable[Any, Any]] | None,
    kwargs: dict[str, Any],
) -> Runnable[Any, Any]:
    """Structured output of ``model`` by ``method``; ``function_calling``: the base class's (a forced tool call)."""
    if method not in METHODS:
        msg = f"method must be one of {list(METHODS)}, got {method!r}"
        raise ConfigurationError(msg)
    if function_calling is not None:
        return function_calling(schema, include_raw=include_raw, **kwargs)
    if kwargs:
        msg = f"unsupported with_structured_output argument(s) {sorted(kwargs)}"
        raise ConfigurationError(msg)
    # json_mode: a JSON object, of the schema's shape when it has one (decoding under it is what
    # makes the parse succeed); unlike json_schema, the schema is not told to the model.
    json_schema = closed(convert_to_json_schema(dict(schema) if isinstance(schema, Mapping) else schema))
    if method == "json_mode" and "properties" not in json_schema:
        json_schema = {"type": "object"}
    format_: dict[str, Any] = {
        "type": "json_schema",
        "json_schema": {"name": json_schema.get("title", "output"), "schema": json_schema},
    }
    if method == "json_mode":
        format_ = {"type": "json_object", "schema": json_schema}
    llm = model.bind(
        response_format=format_,
        ls_structured_output_format={"kwargs": {"method": method}, "schema": schema},
    )
    parser: Runnable[Any, Any]
    if isinstance(schema, type) and is_basemodel_subclass(schema):
        parser = PydanticOutputParser(pydantic_object=schema)
    else:
        parser = JsonOutputParser()
    if include_raw:
        assign = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        fallback = assign.with_fallbacks([RunnablePassthrough.assign(parsed=lambda _: None)], exception_key="parsing_error")
        return RunnableMap(raw=llm) | fallback
    return llm | parser
