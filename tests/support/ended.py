"""The order in which a backend's rows end, recorded in its worker thread (the schedule's order)."""

from __future__ import annotations

from typing import Any


def ended_order(backend: Any) -> list[int]:
    """The prompt lengths of ``backend``'s rows as they end (appended by wrapping its ``_generation``)."""
    order: list[int] = []
    real = backend._generation

    def record(row: Any) -> Any:
        g = real(row)
        order.append(g.prompt_tokens)
        return g

    backend._generation = record
    return order
