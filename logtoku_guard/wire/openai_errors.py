"""Validation errors of the wire protocol's requests as one sentence naming the field, the value and the fix.

:class:`WireValueError` is what a request model's own rules raise (the message and the field);
:func:`describe_errors` turns pydantic's (or FastAPI's) ``errors()`` into ``(message, param)``
for the request models it is given (:func:`logtoku_guard.wire.openai_protocol.describe_errors`
gives it the protocol's). On the client's side, :func:`withheld_message` says why a response that is
a refusal (a guarded server's withheld answer) cannot be scored. No web framework is imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from logtoku_guard.errors import short_repr

__all__ = ["WireValueError", "describe_errors", "withheld_message"]


class WireValueError(ValueError):
    """A request refused by one of the models' own rules: the whole message, and the field it names."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "literal_error": "{expected}",
    "too_short": "a non-empty list",
}
_RANGE = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _field_names(models: Sequence[type[BaseModel]]) -> frozenset[str]:
    names: set[str] = set()
    for model in models:
        names.update(model.model_fields)
        names.update(f.alias for f in model.model_fields.values() if f.alias)
    return frozenset(names)


def _path(loc: Sequence[int | str], fields: frozenset[str]) -> list[int | str]:
    """The location without FastAPI's ``body`` root and pydantic's union-member tags (``str``, ``list[str]``)."""
    parts = list(loc[1:] if loc[:1] == ("body",) else loc)
    return [p for p in parts if isinstance(p, int) or p in fields]


def _path_text(path: Sequence[int | str]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "the request body"


def _number(value: Any) -> str:
    if isinstance(value, int) and value > 2**32 and (value + 1).bit_count() == 1:
        return f"2**{(value + 1).bit_length() - 1} - 1"
    return str(value)


def _expected(error: Mapping[str, Any]) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return "a finite number"  # an integer too large for a float
    if kind in _RANGE:
        return f"{_RANGE[kind]} {_number(next(iter(ctx.values())))}"
    if kind in _EXPECTED:
        return _EXPECTED[kind].format(**ctx)
    return str(error.get("msg", kind)).rstrip(".")


def describe_errors(
    errors: Sequence[Mapping[str, Any]], models: Sequence[type[BaseModel]], requests: Sequence[type[BaseModel]] = ()
) -> tuple[str, str | None]:
    """``(message, param)`` for a request's validation errors (pydantic's or FastAPI's ``errors()``).

    ``models``: every model a request body holds (their field names make up the paths);
    ``requests``: the top-level request models (their fields' bounds are named whole). The
    first failing field is described; alternatives of a field that takes several forms
    (``stop``: a string or a list of strings) are named together.
    """
    fields = _field_names(models)
    if not errors:
        return "the request body is not valid", None
    first = errors[0]
    kind = first["type"]
    if kind in ("value_error", "assertion_error") and isinstance((first.get("ctx") or {}).get("error"), WireValueError):
        err = first["ctx"]["error"]
        return str(err), err.param
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON ({detail} at character {first['loc'][-1]})", None
    path = _path(first["loc"], fields)
    param = str(path[0]) if path and isinstance(path[0], str) else None
    subject = _path_text(path)
    if kind == "missing":
        return (f"{subject} is required" if path else "the request body is missing; send a JSON object"), param
    if not path and isinstance(first.get("input"), bytes):
        return "the request body must be JSON sent with the header 'Content-Type: application/json'", None
    # a union reports one error per alternative at the same place: name them all
    same = [e for e in errors if _path(e["loc"], fields) == path and e["type"] not in ("value_error", "missing")]
    deeper = [e for e in errors if len(_path(e["loc"], fields)) > len(path) and _path(e["loc"], fields)[: len(path)] == path]
    if deeper:  # an alternative that got further (a list whose item is wrong) says more
        return describe_errors(deeper, models, requests)
    expected = " or ".join(dict.fromkeys(_expected(e) for e in same or [first]))
    if kind in _RANGE and param is not None:
        expected = _range_of(param, requests) or expected
    return f"{subject} must be {expected}, got {short_repr(first.get('input'))}", param


def _range_of(name: str, requests: Sequence[type[BaseModel]]) -> str | None:
    """The field's whole range when it has two bounds: ``"an integer from 0 to 2**64 - 1"``, ``"a number > 0 and <= 1"``."""
    for model in requests:
        info = model.model_fields.get(name)
        if info is None:
            continue
        bounds = {a: getattr(m, a) for m in info.metadata for a in ("ge", "gt", "le", "lt") if getattr(m, a, None) is not None}
        low = next(((a, v) for a, v in bounds.items() if a in ("ge", "gt")), None)
        high = next(((a, v) for a, v in bounds.items() if a in ("le", "lt")), None)
        if low is None or high is None:
            return None
        kind = "a number" if "float" in str(info.annotation) else "an integer"
        if low[0] == "ge" and high[0] == "le":
            return f"{kind} from {_number(low[1])} to {_number(high[1])}"
        return f"{kind} {_RANGE[_OPS[low[0]]]} {_number(low[1])} and {_RANGE[_OPS[high[0]]]} {_number(high[1])}"
    return None


_OPS = {"ge": "greater_than_equal", "gt": "greater_than", "le": "less_than_equal", "lt": "less_than"}


def withheld_message(url: str, refusal: str | None, decision: Any) -> str | None:
    """Why a chat response from ``url`` that is a refusal has nothing to score (None when it is not one):
    a guarded ``logtoku-guard serve`` withheld its draft (``decision``: its ``logtoku_guard``, whose
    action, rule and review id are named), or the model refused. A remote guard needs a server without
    ``--policy``: it then decides as a local one."""
    withheld = isinstance(decision, Mapping) and bool(decision.get("withheld"))
    if refusal is None and not withheld:
        return None
    if not withheld:
        return f"{url} sent a refusal instead of an answer ({refusal!r}), with no tokens to score"
    review = f", review id {decision['review_id']}" if decision.get("review_id") is not None else ""
    return (
        f"{url} withheld the answer: its own guard decided {decision.get('action')!r} (rule {decision.get('rule')!r}"
        f"{review}) and sent the refusal {refusal!r}, with no tokens to score; point this backend at a server "
        "without --policy to guard its answers here"
    )
