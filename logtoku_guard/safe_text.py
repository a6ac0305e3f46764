"""Stored or user-given text made safe to show: :func:`safe_text`, for the terminal and the review page alike.

Below both the CLI and the review page (neither imports the other for it). Rich markup is never
interpreted (``[link=...]``, ``[/x]`` stay literal), and control and invisible characters are
shown as escapes (ESC as ``\\x1b``, U+202E as ``\\u202e``, a tag character as ``\\U000e0049``).
"""

from __future__ import annotations

import re

from rich.text import Text

__all__ = ["safe_text"]

# C0 controls but newline and tab, DEL, C1 controls, and invisible characters that can hide or
# reorder text: zero-width, bidirectional marks, overrides and isolates, the BOM, the soft hyphen,
# the combining grapheme joiner, the Hangul and Khmer fillers, the Mongolian vowel separator, and the
# tag characters (U+E0000-U+E007F, which can spell a whole hidden sentence: "IGNORE PREVIOUS ...").
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u2069\u3164\ufeff\uffa0\U000e0000-\U000e007f]"
)


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_text(value: object, style: str = "") -> Text:
    """``value`` as a Rich :class:`Text` that is safe to print: no markup is interpreted
    (``[link=...]``, ``[/x]`` stay literal) and control and invisible characters are shown as
    escapes (ESC as ``\\x1b``, U+202E as ``\\u202e``). Use it for every stored or user-given text."""
    text = _UNSAFE.sub(lambda m: _escape(m[0]), str(value))
    return Text(text, style=style)
