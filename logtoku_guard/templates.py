"""The message templates a policy holds (``human_review.message``, ``tool_calls.reask.message``, ...).

One check for all of them, :func:`check_template`: valid ``str.format`` syntax, only the fields
the message is filled with, and a format spec only of the standard form with a width and a
precision of at most :data:`MAX_WIDTH` (``{review_id:04d}`` is fine). A width is what makes a
template a memory bomb (``{review_id:>999999999}`` took 1 GB when the policy was loaded,
``40000000000`` raised MemoryError).
"""

from __future__ import annotations

import re
import string
from typing import Any

from logtoku_guard.errors import short_repr

__all__ = ["MAX_WIDTH", "check_template"]

MAX_WIDTH = 64
"""Largest width or precision in a message template's format spec."""
_SPEC = re.compile(r"(?:.?[<>=^])?[+\- ]?z?#?0?(?P<width>\d+)?[_,]?(?:\.(?P<precision>\d+))?[bcdeEfFgGnosxX%]?", re.DOTALL)


def check_template(template: str, allowed: set[str], what: str, **example: Any) -> str:
    """``template`` when it is a format string of bare ``allowed`` fields (ValueError naming ``what`` otherwise),
    after filling it once with ``example``."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        msg = f"{what} is not a valid format string ({exc}; write literal braces as {{{{ and }}}}), got {short_repr(template)}"
        raise ValueError(msg) from None
    names = ", ".join("{" + n + "}" for n in sorted(allowed))
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in allowed:
            msg = (
                f"{what} may only use {names}, found {short_repr(name)} in {short_repr(template)}; "
                "write literal braces as {{ and }}"
            )
            raise ValueError(msg)
        if spec:
            match = _SPEC.fullmatch(spec)
            shown = "{" + name + (f"!{conversion}" if conversion else "") + f":{spec}" + "}"
            if match is not None and spec.endswith("c"):
                msg = (
                    f"{what} formats {short_repr(shown)}: the 'c' format turns the number into a character (1 prints "
                    f"as an invisible control character); use {{{name}}} bare or a number format such as {{{name}:04d}}"
                )
                raise ValueError(msg)
            digits = [n for n in (match.group("width"), match.group("precision")) if n] if match else None
            # compared as digits first: int() of a 5000-digit width fails with Python's own digit-limit message
            sizes = (
                [int(n) if len(n.lstrip("0")) <= len(str(MAX_WIDTH)) else MAX_WIDTH + 1 for n in digits]
                if digits is not None
                else None
            )
            if sizes is None or any(n > MAX_WIDTH for n in sizes):
                msg = (
                    f"{what} formats {short_repr(shown)}: a format spec may hold a width and a precision of at most "
                    f"{MAX_WIDTH} and nothing nested (e.g. {{{name}:04d}}), or use {{{name}}} bare"
                )
                raise ValueError(msg)
    try:
        template.format(**example)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        msg = f"{what} cannot be filled in ({exc.__class__.__name__}: {exc}), got {short_repr(template)}"
        raise ValueError(msg) from None
    return template
