"""The one driver of the tool-call loop: every entry point hands it *reask* and *record*, nothing more.

:func:`~logtoku_guard.guard.tool_steps.tool_steps` decides (written once, without I/O); this
module answers its requests for the server (:mod:`logtoku_guard.server.gate`, async: its answers
come from the engine, its review queue is written in a worker thread) and LangChain's tool gate
(sync, inside the agent's ``after_model``). An entry point supplies a :class:`ToolIO`:

* ``reask(request)``: the next answer as a :class:`~logtoku_guard.guard.tool_steps.ToolTurn`, made
  from the conversation with the answer's calls and ``request.results`` as their results. None:
  the entry point makes that answer in a loop of its own (an agent graph's next model turn);
  the driver then stops and returns the :class:`~logtoku_guard.guard.tool_steps.Reask`, and the
  next answer is read by a new drive with ``reasks=request.number``.
* ``record(request)``: write the stopped calls' records; one ``ReviewItem | None`` per call.

Sync (:func:`drive_tools`) and async (:func:`adrive_tools`): the same loop, differing only by await.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Protocol

from logtoku_guard.guard.tool_steps import Reask, Record, ToolsDecided, ToolTurn, tool_steps

if TYPE_CHECKING:
    from logtoku_guard.audit.records import ReviewItem
    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.scoring.quadrants import QuadrantThresholds

__all__ = ["AsyncToolIO", "ToolIO", "adrive_tools", "drive_tools"]


class ToolIO(Protocol):
    """What an entry point supplies to :func:`drive_tools` (see the module doc)."""

    def reask(self, request: Reask) -> ToolTurn | None: ...

    def record(self, request: Record) -> Sequence[ReviewItem | None]: ...


class AsyncToolIO(Protocol):
    """:class:`ToolIO` for :func:`adrive_tools`."""

    def reask(self, request: Reask) -> Awaitable[ToolTurn | None]: ...

    def record(self, request: Record) -> Awaitable[Sequence[ReviewItem | None]]: ...


def drive_tools(
    policy: Policy,
    turn: ToolTurn,
    io: ToolIO,
    *,
    question: str,
    reasks: int = 0,
    quadrants: QuadrantThresholds | None = None,
) -> ToolsDecided | Reask:
    """Decide ``turn``'s calls under ``policy``'s ``tool_calls`` rules, answering the loop's requests
    with ``io``: the decisions, or the :class:`Reask` ``io`` left to its caller (``reask`` returned
    None). ``question``, ``reasks``, ``quadrants``: as :func:`~logtoku_guard.guard.tool_steps.tool_steps`'s."""
    steps = tool_steps(policy, turn, question=question, reasks=reasks, quadrants=quadrants)
    request = next(steps)
    while not isinstance(request, ToolsDecided):
        if isinstance(request, Reask):
            answer = io.reask(request)
            if answer is None:
                steps.close()
                return request
            request = steps.send(answer)
        else:
            request = steps.send(io.record(request))
    steps.close()
    return request


async def adrive_tools(
    policy: Policy,
    turn: ToolTurn,
    io: AsyncToolIO,
    *,
    question: str,
    reasks: int = 0,
    quadrants: QuadrantThresholds | None = None,
) -> ToolsDecided | Reask:
    """:func:`drive_tools` for async entry points."""
    steps = tool_steps(policy, turn, question=question, reasks=reasks, quadrants=quadrants)
    request = next(steps)
    while not isinstance(request, ToolsDecided):
        if isinstance(request, Reask):
            answer = await io.reask(request)
            if answer is None:
                steps.close()
                return request
            request = steps.send(answer)
        else:
            request = steps.send(await io.record(request))
    steps.close()
    return request
