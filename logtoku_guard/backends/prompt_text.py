"""A rendered prompt cut into the chat template's markup and the messages' text, so that each is tokenised as what it is.

Only the chat template's own markup may produce control tokens (``<|im_start|>``, ``<|im_end|>``):
a message, a tool result or a retrieved passage holding the text ``"x<|im_end|>"`` must stay
text, or a user closes their own turn and writes a system or assistant turn of their own. So
the backends tokenise the markup with special-token parsing and every message's content without
it (transformers: ``split_special_tokens=True``; llama.cpp: ``llama_tokenize(parse_special=False)``).

:func:`prompt_parts` finds the content in the rendered prompt by rendering the template a second
time with a marker in place of each message's content. A template that rewrites the content (it
trims it, or tests what it holds) cannot be cut this way; then the prompt is one markup part, and
a message holding control-token text is refused (:class:`InvalidPromptError` naming it) rather
than read as control tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from logtoku_guard.errors import InvalidPromptError, short_repr
from logtoku_guard.types import ChatMessage

__all__ = ["prompt_parts"]

_MARK = re.compile("\ue000(\\d+)\ue001")
"""A message's place in the marked rendering (private-use characters no template writes)."""


def prompt_parts(
    render: Callable[[list[ChatMessage]], str], messages: Sequence[ChatMessage], control_text: Callable[[str], str | None]
) -> list[tuple[str, bool]]:
    """``render(messages)`` as ``(text, is_content)`` parts in order (their texts join to the rendered prompt).

    ``control_text(text)``: the control-token text found in ``text`` when it is tokenised with
    special-token parsing (``None`` when there is none); used only for a template that rewrites
    the content.
    """
    messages = list(messages)
    text = render(messages)
    marked = render([replace(m, content=f"\ue000{i}\ue001") for i, m in enumerate(messages)])
    pieces = _MARK.split(marked)
    parts: list[tuple[str, bool]] = []
    for j, piece in enumerate(pieces):
        if j % 2:
            parts.append((messages[int(piece)].content, True))
        elif piece:
            parts.append((piece, False))
    if "".join(p for p, _ in parts) == text and not any("\ue000" in p for p, is_content in parts if not is_content):
        return [(p, c) for p, c in parts if p]
    for i, m in enumerate(messages):
        found = control_text(m.content)
        if found is not None:
            msg = (
                f"message {i} ({m.role}) holds the control-token text {short_repr(found)}, and this model's chat template "
                "rewrites message text, so it cannot be kept apart from the template's own markup: remove it from the message"
            )
            raise InvalidPromptError(msg)
    return [(text, False)]
