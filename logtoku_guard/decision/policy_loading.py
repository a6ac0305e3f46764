"""Bounded reading of policy files and data: size, node count and nesting depth are capped.

A policy file is small, hand-written data; anything else is refused before (or while) it is
parsed, with a :class:`~logtoku_guard.errors.PolicyError` naming the file and the bound:

- at most :data:`MAX_POLICY_BYTES` bytes (checked before reading), valid UTF-8 (the message
  gives the byte offset of the first bad byte);
- YAML is read by a safe loader that refuses aliases (``*name``: the "billion laughs" bomb
  needs them) and counts nodes and depth while composing, so nothing is expanded;
- a key given twice in one mapping (YAML) or object (JSON) is refused with its line, never
  silently resolved to the last value;
- at most :data:`MAX_POLICY_NODES` values and :data:`MAX_POLICY_DEPTH` levels of nesting, in
  files and in dicts given directly (:func:`check_bounds`).

:func:`~logtoku_guard.errors.short_repr` bounds every echo of user input in error messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from logtoku_guard.errors import PolicyError, short_repr

__all__ = [
    "MAX_POLICY_BYTES",
    "MAX_POLICY_DEPTH",
    "MAX_POLICY_NODES",
    "check_bounds",
    "parse_policy_text",
    "read_policy_file",
]

MAX_POLICY_BYTES = 1_000_000
"""Largest policy file read, in bytes (a real policy is a few kB)."""
MAX_POLICY_NODES = 100_000
"""Most values (mappings, lists and scalars) in one policy."""
MAX_POLICY_DEPTH = 64
"""Deepest nesting of mappings and lists in one policy."""


def check_bounds(data: Any, source: str = "policy") -> None:
    """Raise :class:`PolicyError` when ``data`` has more than the allowed values or nesting.

    Iterative (no recursion), stops at the first bound crossed; shared or self-referencing
    containers are counted at every place they appear, so they cannot hide an expansion.
    """
    stack: list[tuple[Any, int]] = [(data, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_POLICY_NODES:
            msg = f"{source} has more than {MAX_POLICY_NODES} values; a policy is a short list of rules"
            raise PolicyError(msg)
        if depth > MAX_POLICY_DEPTH:
            msg = f"{source} is nested more than {MAX_POLICY_DEPTH} levels deep; flatten the conditions"
            raise PolicyError(msg)
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1) for v in value.values())
            nodes += len(value)  # the keys
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)


def _bounded_loader(source: str) -> type:
    import yaml

    class BoundedSafeLoader(yaml.SafeLoader):
        """``yaml.SafeLoader`` that refuses aliases and counts nodes and depth while composing."""

        nodes = 0
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.get_event()
                msg = (
                    f"{source}: YAML aliases are not allowed in policy files (found *{short_repr(event.anchor)} "
                    f"at line {event.start_mark.line + 1}); write the value out in full"
                )
                raise PolicyError(msg)
            self.nodes += 1
            if self.nodes > MAX_POLICY_NODES:
                msg = f"{source} has more than {MAX_POLICY_NODES} values; a policy is a short list of rules"
                raise PolicyError(msg)
            self.depth += 1
            try:
                if self.depth > MAX_POLICY_DEPTH:
                    msg = f"{source} is nested more than {MAX_POLICY_DEPTH} levels deep; flatten the conditions"
                    raise PolicyError(msg)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key = key_node.value
                    line = key_node.start_mark.line + 1
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        msg = (
                            f"{source}: YAML merge keys (<<, line {line}) are not allowed in policy files: like a key "
                            "given twice, they silently pick one value; write the keys out in full"
                        )
                        raise PolicyError(msg)
                    if key in seen:
                        msg = (
                            f"{source}: the key {short_repr(key)} is given twice in one mapping (lines {seen[key]} and "
                            f"{line}); YAML would silently keep the last one: remove or rename one of them"
                        )
                        raise PolicyError(msg)
                    seen[key] = line
            return super().construct_mapping(node, deep)

    # Integers are decimal only: YAML 1.1 would read 0x10 as 16, 1:30 as 90 and 010 as 8, silently; left as
    # strings, such a threshold is refused by the policy's validation with its text.
    int_tag = "tag:yaml.org,2002:int"
    BoundedSafeLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != int_tag]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    BoundedSafeLoader.add_implicit_resolver(int_tag, re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789"))
    return BoundedSafeLoader


def _no_duplicate_keys(source: str) -> Any:
    """A ``json.loads`` ``object_pairs_hook`` that refuses a key given twice in one object."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                msg = (
                    f"{source}: the key {short_repr(key)} is given twice in one object; "
                    "JSON readers would silently keep the last one: remove or rename one of them"
                )
                raise PolicyError(msg)
            out[key] = value
        return out

    return hook


def parse_policy_text(text: str, kind: str, source: str) -> Any:
    """Parse ``text`` as ``kind`` (``"YAML"`` or ``"JSON"``) within the bounds; ``source`` names it in errors."""
    if kind == "YAML":
        import yaml

        try:
            loader = _bounded_loader(source)(text)  # the reader checks the characters here already
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
        except PolicyError:  # a duplicate key, a merge key, an alias, a bound: already says what is wrong
            raise
        except yaml.YAMLError as exc:
            msg = f"{source} is not valid YAML: {str(exc)[:500]}"
            raise PolicyError(msg) from exc
        except ValueError as exc:  # an integer past Python's 4300-digit limit for reading one
            msg = f"{source} holds a number Python cannot read ({str(exc)[:200]}); a threshold needs a few digits"
            raise PolicyError(msg) from exc
    else:
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys(source))
        except PolicyError:  # a duplicate key (PolicyError is a ValueError too: never reworded below)
            raise
        except json.JSONDecodeError as exc:
            msg = f"{source} is not valid JSON: {exc}"
            raise PolicyError(msg) from exc
        except RecursionError as exc:
            msg = f"{source} is nested more than {MAX_POLICY_DEPTH} levels deep; flatten the conditions"
            raise PolicyError(msg) from exc
        except ValueError as exc:  # an integer past Python's 4300-digit limit for reading one
            msg = f"{source} holds a number Python cannot read ({str(exc)[:200]}); a threshold needs a few digits"
            raise PolicyError(msg) from exc
    check_bounds(data, source)
    return data


def read_policy_file(path: str | Path) -> Any:
    """The parsed content of a YAML (``.yaml``/``.yml``) or JSON policy file, within the bounds
    (a regular file only: a named pipe or a device is refused before anything is read)."""
    from logtoku_guard.errors import ConfigurationError
    from logtoku_guard.files import read_bounded_text

    p = Path(path)
    source = f"policy file {str(p)!r}"
    try:
        text = read_bounded_text(p, MAX_POLICY_BYTES, "policy file")
    except PolicyError:
        raise
    except ConfigurationError as exc:
        raise PolicyError(str(exc)) from exc
    return parse_policy_text(text, "YAML" if p.suffix.lower() in (".yaml", ".yml") else "JSON", source)
