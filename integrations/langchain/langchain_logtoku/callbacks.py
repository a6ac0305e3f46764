"""Tracing flagged answers: the guard's custom events and a ready handler that collects them.

The guard (:class:`~langchain_logtoku.guard.LogTokUGuard`) dispatches two custom events on its
own run (``on_custom_event``; ``astream_events(version="v2")`` shows them as ``on_custom_event``):

- :data:`FLAGGED_EVENT` (``"logtoku_flagged"``) for every route other than a single plain pass
  (warn, retrieve (even when the retrieved answer then passed), abstain, human review, raise):
  ``data`` is the decision, the same :class:`~langchain_logtoku._convert.GuardPayload` as the
  answer's ``response_metadata["logtoku_guard"]`` (``route``: each attempt's action and rule),
  plus the flat ``logtoku.*`` keys of :func:`logtoku_guard.wire.payloads.decision_attributes`
  (``logtoku.action``, ``logtoku.rule``, ``logtoku.route``, ``logtoku.rules``, ...).
- :data:`RETRACTED_EVENT` (``"logtoku_retracted"``), in ``stream_mode="retract"`` only, when
  an answer already streamed is withdrawn: ``data`` is the decision plus ``retracted_text``
  (what was streamed); the replacement is ``data["answer"]``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from langchain_logtoku._convert import GuardPayload

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditStore

FLAGGED_EVENT = "logtoku_flagged"
RETRACTED_EVENT = "logtoku_retracted"

logger = logging.getLogger("langchain_logtoku")


def annotate_tracer_runs(
    handlers: Iterable[BaseCallbackHandler], run_id: UUID | str, tags: Iterable[str], metadata: Mapping[str, Any]
) -> None:
    """Add ``tags`` (those not there yet) and ``metadata`` to run ``run_id`` in every attached tracer.

    A tracer's run has fixed tags and metadata once it started, before any decision exists; this
    updates the run before it ends, so it can be filtered by them once posted (LangSmith). New
    tag list, ``extra`` and metadata dicts are assigned: the ones the run started with are
    shared with other handlers (they got them in ``on_chain_start``) and stay untouched.
    """
    from langchain_core.tracers.base import BaseTracer

    for handler in handlers:
        if isinstance(handler, BaseTracer):
            run = handler.run_map.get(str(run_id))
            if run is not None:
                present = list(run.tags or [])
                run.tags = [*present, *(t for t in dict.fromkeys(tags) if t not in present)]
                extra = dict(run.extra or {})
                extra["metadata"] = {**(extra.get("metadata") or {}), **metadata}
                run.extra = extra


@dataclass(frozen=True)
class FlaggedAnswer:
    """One answer the guard did not simply pass.

    ``reliability``: the response score the policy read (higher = more reliable; ``None``
    when undefined). ``draft``: what the model answered on the last attempt; ``answer``: what
    the guard returned (a disclaimer added, an abstention, the pending-review message...).
    ``run_id``: the guard's run; ``decision``: the full event payload.
    """

    run_id: UUID
    action: str
    rule: str | None
    reason: str
    reliability: float | None
    question: str
    answer: str
    draft: str
    trace_id: str
    review_id: int | None
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    decision: Mapping[str, Any] = field(default_factory=dict)


class FlaggedAnswerHandler(BaseCallbackHandler):
    """Collects the guard's flagged answers; optionally logs them and writes them to an audit store.

    Args:
        store: an :class:`~logtoku_guard.audit.AuditStore`; each flagged decision that the
            guard did not record itself (a guard without ``store=``) is written there.
        log_level: log each flagged answer on the ``langchain_logtoku`` logger at this level
            (``None``: do not log).
        on_flagged: called with each :class:`FlaggedAnswer` (e.g. to page someone).

    Attach it like any handler: ``chain.invoke(x, config={"callbacks": [handler]})``; read
    :attr:`flagged`.
    """

    def __init__(
        self,
        *,
        store: AuditStore | None = None,
        log_level: int | None = logging.INFO,
        on_flagged: Callable[[FlaggedAnswer], None] | None = None,
    ) -> None:
        self.store = store
        self.log_level = log_level
        self.on_flagged = on_flagged
        self._lock = threading.Lock()
        self._flagged: list[FlaggedAnswer] = []

    @property
    def flagged(self) -> list[FlaggedAnswer]:
        """The flagged answers seen so far, oldest first (a copy)."""
        with self._lock:
            return list(self._flagged)

    def clear(self) -> None:
        with self._lock:
            self._flagged.clear()

    def on_custom_event(
        self,
        name: str,
        data: Any,
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if name != FLAGGED_EVENT or not isinstance(data, Mapping):
            return
        d = cast(GuardPayload, data)
        item = FlaggedAnswer(
            run_id=run_id,
            action=d["action"],
            rule=d["rule"],
            reason=d["reason"],
            reliability=d["reliability"],
            question=d["question"],
            answer=d["answer"],
            draft=d["draft"],
            trace_id=d["trace_id"],
            review_id=d["review_id"],
            tags=tuple(tags or ()),
            metadata=dict(metadata or {}),
            decision=dict(d),
        )
        with self._lock:
            self._flagged.append(item)
        if self.log_level is not None:
            logger.log(
                self.log_level,
                "flagged answer: action=%s rule=%s reliability=%s trace=%s: %s",
                item.action,
                item.rule,
                item.reliability,
                item.trace_id,
                item.reason,
            )
        if self.store is not None and not d["recorded"]:
            self._record(self.store, item, d)
        if self.on_flagged is not None:
            self.on_flagged(item)

    @staticmethod
    def _record(store: AuditStore, item: FlaggedAnswer, d: GuardPayload) -> None:
        from logtoku_guard.audit import AuditRecord

        store.record(AuditRecord.from_payload(d, question=item.question, draft=item.draft))
