"""Per-argument uncertainty of a model's tool calls, parsed from an answer's metadata.

A scoring chat model writes, beside the tool calls of its answer, one entry per call::

    response_metadata["logtoku"]["tool_calls"] = [
        {"id": "call_1", "name": "transfer",
         "arguments": {"amount": {"tokens": 3, "mean_au": 0.4, "mean_eu": 0.2,
                                  "max_au": 0.9, "max_eu": 0.31, "logprob": -2.7}}},
    ]

``id`` and ``name`` are those of the call in ``AIMessage.tool_calls``; ``arguments`` holds one
entry per top-level argument, over the tokens of the argument's value (not the JSON syntax
around it): ``tokens`` how many, AU/EU their mean and maximum (higher = more uncertain),
``logprob`` the summed log-probability of those tokens (natural log, higher = more likely).
:func:`parse_tool_call_scores` turns this into frozen :class:`ScoredToolCall` objects and refuses
malformed metadata with an error naming the bad value. Framework-free: the input is plain data.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from logtoku_guard.errors import ConfigurationError, short_repr

__all__ = ["ARGUMENT_STATS", "ArgumentScore", "ArgumentStat", "ScoredToolCall", "parse_tool_call_scores"]

ArgumentStat = Literal["tokens", "mean_au", "mean_eu", "max_au", "max_eu", "logprob"]
"""The statistics of one argument value; ``logprob`` is the only one where higher = more reliable."""

ARGUMENT_STATS: tuple[str, ...] = ("tokens", "mean_au", "mean_eu", "max_au", "max_eu", "logprob")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        msg = f"{where} must be a number, got {short_repr(value)}; the scorer writes floats (NaN for an empty value)"
        raise ConfigurationError(msg)
    return float(value)


@dataclass(frozen=True)
class ArgumentScore:
    """The uncertainty of one argument value, over the tokens of that value.

    ``tokens``: how many tokens the value took. ``mean_au``/``mean_eu``/``max_au``/``max_eu``:
    aleatoric and epistemic uncertainty (higher = more uncertain), NaN for a value of no
    tokens. ``logprob``: the summed natural-log probability of the value's tokens (higher = more
    likely; 0 for no tokens).
    """

    tokens: int
    mean_au: float
    mean_eu: float
    max_au: float
    max_eu: float
    logprob: float

    def get(self, stat: str) -> float:
        """The statistic ``stat`` (one of :data:`ARGUMENT_STATS`) as a float."""
        if stat not in ARGUMENT_STATS:
            msg = f"unknown argument statistic {stat!r}; use one of {', '.join(ARGUMENT_STATS)}"
            raise ConfigurationError(msg)
        return float(getattr(self, stat))

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ArgumentScore:
        """Validate one argument's entry; ``where`` names it in errors."""
        if not isinstance(data, Mapping):
            msg = f"{where} must be a mapping of {', '.join(ARGUMENT_STATS)}, got {short_repr(data)}"
            raise ConfigurationError(msg)
        missing = [s for s in ARGUMENT_STATS if s not in data]
        extra = sorted(str(k) for k in data if k not in ARGUMENT_STATS)
        if missing or extra:
            parts = [f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(extra)}" if extra else ""]
            msg = f"{where}: {'; '.join(p for p in parts if p)}; an argument's scores are exactly {', '.join(ARGUMENT_STATS)}"
            raise ConfigurationError(msg)
        tokens = data["tokens"]
        if isinstance(tokens, bool) or not isinstance(tokens, numbers.Integral) or int(tokens) < 0:
            msg = f"{where}.tokens must be a non-negative integer, got {short_repr(tokens)}"
            raise ConfigurationError(msg)
        values = {s: _number(data[s], f"{where}.{s}") for s in ARGUMENT_STATS[1:]}
        for s, v in values.items():
            if math.isinf(v) and s != "logprob":
                msg = f"{where}.{s} is {v}; AU/EU are finite (NaN when undefined): check the scorer"
                raise ConfigurationError(msg)
        return cls(tokens=int(tokens), **values)

    def to_dict(self) -> dict[str, float | int]:
        """The contract's form (NaN kept as NaN; the audit record turns it into null)."""
        return {s: getattr(self, s) for s in ARGUMENT_STATS}


@dataclass(frozen=True)
class ScoredToolCall:
    """One tool call as the model made it, with the scores of its arguments.

    ``args``: the argument values (``AIMessage.tool_calls[i]["args"]``). ``scores``: the
    per-argument scores by argument name; an argument of ``args`` without an entry was not
    scored (its statistics are undefined). ``scored``: False when the answer carried no scores
    for this call at all.
    """

    id: str
    name: str
    args: Mapping[str, Any]
    scores: Mapping[str, ArgumentScore]
    scored: bool = True

    def score_of(self, argument: str) -> ArgumentScore | None:
        return self.scores.get(argument)


def parse_tool_call_scores(metadata: Any, tool_calls: Sequence[Mapping[str, Any]]) -> list[ScoredToolCall]:
    """The scored form of ``tool_calls`` (``AIMessage.tool_calls``) from ``metadata``
    (``AIMessage.response_metadata``), in the calls' order.

    A call whose id has no entry under ``metadata["logtoku"]["tool_calls"]`` (or an answer with
    no such list) comes back with ``scored=False`` and no scores. Raises
    :class:`~logtoku_guard.errors.ConfigurationError` on malformed metadata: a list that is not a
    list of mappings, an entry without a string ``id``, a name that differs from the call's, an
    id given twice or matching no call, scores of the wrong shape.
    """
    logtoku = metadata.get("logtoku") if isinstance(metadata, Mapping) else None
    entries = logtoku.get("tool_calls") if isinstance(logtoku, Mapping) else None
    where = "response_metadata['logtoku']['tool_calls']"
    by_id: dict[str, Mapping[str, Any]] = {}
    if entries is not None:
        if not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)):
            msg = f"{where} must be a list of {{id, name, arguments}} entries, got {short_repr(entries)}"
            raise ConfigurationError(msg)
        for i, entry in enumerate(entries):
            here = f"{where}[{i}]"
            if not isinstance(entry, Mapping) or set(entry) != {"id", "name", "arguments"}:
                msg = f"{here} must be a mapping with exactly id, name and arguments, got {short_repr(entry)}"
                raise ConfigurationError(msg)
            if not isinstance(entry["id"], str) or not entry["id"]:
                msg = f"{here}.id must be the tool call's id (a non-empty string), got {short_repr(entry['id'])}"
                raise ConfigurationError(msg)
            if entry["id"] in by_id:
                msg = f"{here}.id {entry['id']!r} is given twice; one entry per tool call"
                raise ConfigurationError(msg)
            by_id[entry["id"]] = entry
    ids = {c.get("id") for c in tool_calls}
    unknown = sorted(set(by_id) - ids)
    if unknown:
        made = short_repr(sorted(map(str, ids)))
        msg = f"{where} scores tool call id(s) {short_repr(unknown)} that the answer does not make (its calls: {made})"
        raise ConfigurationError(msg)
    out = []
    for call in tool_calls:
        call_id, name, args = str(call.get("id") or ""), str(call.get("name", "")), call.get("args") or {}
        entry = by_id.get(call_id)
        if entry is None:
            out.append(ScoredToolCall(id=call_id, name=name, args=dict(args), scores={}, scored=False))
            continue
        here = f"{where}[id={call_id!r}]"
        if entry["name"] != name:
            msg = (
                f"{here}.name is {short_repr(entry['name'])} but the call with that id is to {name!r}; "
                "the scorer must name the same tool"
            )
            raise ConfigurationError(msg)
        arguments = entry["arguments"]
        if not isinstance(arguments, Mapping):
            msg = f"{here}.arguments must map argument names to scores, got {short_repr(arguments)}"
            raise ConfigurationError(msg)
        scores = {str(k): ArgumentScore.from_dict(v, f"{here}.arguments[{k!r}]") for k, v in arguments.items()}
        out.append(ScoredToolCall(id=call_id, name=name, args=dict(args), scores=scores))
    return out
