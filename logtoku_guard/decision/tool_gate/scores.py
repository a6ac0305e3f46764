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
:func:`parse_tool_call_scores` turns this into frozen :class:`ScoredToolCall` objects (each
argument an :class:`~logtoku_guard.scoring.tool_scores.ArgumentScore`, the type the scorer makes) and
refuses malformed metadata with an error naming the bad value. Framework-free: the input is plain data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logtoku_guard.errors import ConfigurationError, short_repr
from logtoku_guard.scoring.tool_scores import ARGUMENT_STATS, ArgumentScore, ArgumentStat

__all__ = ["ARGUMENT_STATS", "ArgumentScore", "ArgumentStat", "ScoredToolCall", "parse_tool_call_scores"]


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
    for i, call in enumerate(tool_calls):
        _check_call(call, i)
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


def _check_call(call: Any, i: int) -> None:
    """A tool call as the answer made it: ``{"id": str | None, "name": str, "args": {...}}``."""
    here = f"tool call {i}"
    if not isinstance(call, Mapping):
        msg = f"{here} must be a mapping with id, name and args, got {short_repr(call)}"
        raise ConfigurationError(msg)
    if call.get("id") is not None and not isinstance(call.get("id"), str):
        msg = f"{here}'s id must be a string, got {short_repr(call.get('id'))}"
        raise ConfigurationError(msg)
    if not isinstance(call.get("name", ""), str):
        msg = f"{here}'s name must be a string, got {short_repr(call.get('name'))}"
        raise ConfigurationError(msg)
    args = call.get("args")
    if args and not isinstance(args, Mapping):
        msg = f"{here}'s args must map argument names to values (a JSON object), got {short_repr(args)}"
        raise ConfigurationError(msg)
