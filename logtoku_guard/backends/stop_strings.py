"""Stop strings on scored tokens: where an answer ends, and which tokens may be released meanwhile.

Plain functions on :class:`~logtoku_guard.types.TokenScore` lists, shared by the step recorder
(:mod:`~logtoku_guard.backends.recorder`) and the scripted backend, so both cut an answer the
same way: :func:`truncate_at_stop` cuts the answer at its earliest stop string (a token across the cut
keeps its scores and its text up to the cut), :func:`releasable` says how many held tokens
cannot belong to a stop string any more and may be streamed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from logtoku_guard.types import TokenScore

__all__ = ["cut_tokens", "find_stop", "releasable", "truncate_at_stop"]


def find_stop(text: str, stop: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` as ``(character offset, stop string)``, or None.

    Two stop strings starting at the same offset: the one that sorts first wins.
    """
    return min(((text.find(s), s) for s in stop if s in text), default=None)


def cut_tokens(tokens: Sequence[TokenScore], cut: int) -> list[TokenScore]:
    """The tokens whose text starts before character ``cut``; the one across it is truncated.

    A truncated token keeps its scores (its ``text`` only is shortened).
    """
    kept: list[TokenScore] = []
    offset = 0
    for t in tokens:
        if offset >= cut:
            break
        end = offset + len(t.text)
        kept.append(t if end <= cut else dataclasses.replace(t, text=t.text[: cut - offset]))
        offset = end
    return kept


def truncate_at_stop(tokens: Sequence[TokenScore], stop: Sequence[str]) -> tuple[list[TokenScore], str | None]:
    """``tokens`` cut before the earliest stop string, and that stop string (None: none found)."""
    match = find_stop("".join(t.text for t in tokens), stop)
    if match is None:
        return list(tokens), None
    cut, seq = match
    return cut_tokens(tokens, cut), seq


def releasable(tokens: Sequence[TokenScore], stop: Sequence[str]) -> int:
    """How many leading ``tokens`` can no longer be part of a stop string (with no match in them).

    The text that ends the tokens and begins some stop string is held back: a later token may
    complete the stop string.
    """
    text = "".join(t.text for t in tokens)
    safe = len(text) - max((_overlap(text, s) for s in stop), default=0)
    n, offset = 0, 0
    for t in tokens:
        offset += len(t.text)
        if offset > safe:
            break
        n += 1
    return n


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


# -- per-step recording ----------------------------------------------------------------------------
