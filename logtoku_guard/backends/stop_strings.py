"""Stop strings on scored tokens: where an answer ends, and which tokens may be released meanwhile.

Plain functions on :class:`~logtoku_guard.types.TokenScore` lists, shared by the step recorder
(:mod:`~logtoku_guard.backends.recorder`) and the scripted backend, so both cut an answer the
same way: :func:`truncate_at_stop` cuts the answer at its earliest stop string (a token across the cut
keeps its scores and its text up to the cut; the tokens after it are dropped with their scores);
:func:`held_stop` does it for the recorder's held tokens at each step and says how many of them
cannot belong to a stop string any more and may be streamed (the text that ends them and begins
some stop string is held back: a later token may complete it).

Two kinds of stop strings end a row, and both always apply (the earliest match wins):

* the caller's (``DecodingOptions.stop``, a request's ``stop``), looked for from the answer's
  first character, as OpenAI's ``stop`` is;
* the model's own (:attr:`~logtoku_guard.backends.packaged_models.PackagedModel.stop`: where a
  base model's answer ends, which the backend adds to every row as it adds the end-of-sequence
  token), looked for only *after the answer's leading whitespace*: a base model opens its answer
  with a blank line, so a blank-line stop looked for from the first character would end every
  answer empty. :func:`search_start` says where that search begins.

A caller's stop strings can therefore only cut an answer shorter than the model's would, never
make it run on past them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from logtoku_guard.types import TokenScore

__all__ = ["cut_tokens", "find_stop", "held_stop", "search_start", "truncate_at_stop"]


def find_stop(text: str, stop: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` beginning at or after character ``start``, as
    ``(character offset, stop string)``, or None.

    Two stop strings starting at the same offset: the one that sorts first wins.
    """
    found = ((text.find(s, start), s) for s in stop)
    return min(((i, s) for i, s in found if i >= 0), default=None)


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


def search_start(released: Sequence[TokenScore], held: Sequence[TokenScore]) -> int:
    """Where a model's own stop strings may begin in the text of ``held`` (the tokens not yet
    released, after ``released``): 0 once the answer has a non-whitespace character before them,
    else after the held text's leading whitespace (its whole length when it is all whitespace).

    Reads only the answer's leading whitespace tokens and the first token after them.
    """
    if any(t.text.strip() for t in released):  # stops at the first token with text
        return 0
    offset = 0
    for t in held:
        stripped = t.text.lstrip()
        if stripped:
            return offset + len(t.text) - len(stripped)
        offset += len(t.text)
    return offset


def held_stop(
    released: Sequence[TokenScore], held: Sequence[TokenScore], stop: Sequence[str], model_stop: Sequence[str] = ()
) -> tuple[list[TokenScore], str | None, int]:
    """One step of a row's stop strings: ``held`` (the tokens not yet released, after ``released``)
    cut before the earliest match of ``stop`` (the caller's, from the first character) or of
    ``model_stop`` (the model's, after the answer's leading whitespace: :func:`search_start`),
    that stop string (None: none found) and how many held tokens may be released (0 on a match:
    the row ends with the kept ones)."""
    text = "".join(t.text for t in held)
    start = search_start(released, held) if model_stop else 0
    matches = [m for m in (find_stop(text, stop), find_stop(text, model_stop, start)) if m is not None]
    if matches:
        cut, seq = min(matches)
        return cut_tokens(held, cut), seq, 0
    tail = text[start:]
    hold = max(
        max((_overlap(text, s) for s in stop), default=0),
        max((_overlap(tail, s) for s in model_stop), default=0),
    )
    return list(held), None, _release_count(held, len(text) - hold)


def _release_count(tokens: Sequence[TokenScore], safe: int) -> int:
    """How many leading ``tokens`` end at or before character ``safe``."""
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
