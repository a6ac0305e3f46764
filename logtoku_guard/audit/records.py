"""Audit records: one guarded answer and its decision, and a review item (no SQLAlchemy here).

Data flow: prompt -> generation -> token AU/EU -> response score -> policy decision -> action
-> **audit**. Every guarded answer becomes one :class:`AuditRecord`, built from the guard's
result by :meth:`AuditRecord.from_result` (the one way; its tokens, statistics and timings are
the JSON payloads of :mod:`logtoku_guard.wire.payloads`). Answers the policy sends to a human also
get a :class:`ReviewItem`, whose life cycle is::

    pending --claim--> claimed --approve/reject--> approved | rejected
       └──────────────approve/reject (implicit claim)──────┘

This module needs only the standard library and the payload schema, so a guard or an adapter
can build records without SQLAlchemy; the database lives in :mod:`logtoku_guard.audit.store`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from logtoku_guard.errors import ConfigurationError, UnreadableRowError, short_repr
from logtoku_guard.scoring.tool_scores import score_tool_calls
from logtoku_guard.wire.payloads import ResultPayload, json_float, result_payload

if TYPE_CHECKING:
    from logtoku_guard.decision.results import GuardResult
    from logtoku_guard.scoring.quadrants import QuadrantThresholds

__all__ = [
    "AuditRecord",
    "PurgeSummary",
    "RecordSink",
    "ReviewItem",
    "ReviewStatus",
    "SkippedRow",
    "StoredRows",
]

ReviewStatus = Literal["pending", "claimed", "approved", "rejected"]
"""``pending``: waiting for a reviewer; ``claimed``: a reviewer took it; ``approved`` /
``rejected``: decided (final)."""

_OPEN: tuple[ReviewStatus, ...] = ("pending", "claimed")
_DECIDED: tuple[ReviewStatus, ...] = ("approved", "rejected")
_REVIEW_STATUSES: tuple[ReviewStatus, ...] = (*_OPEN, *_DECIDED)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class _NotJSONError(Exception):
    """Internal: a value JSON cannot hold; ``path`` is filled in while unwinding."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.path: list[str] = []


_PLAIN = (str, int, bool, type(None))


def utc_since(since: Any, name: str = "since (CLI: --since)") -> datetime | None:
    """``since`` as an aware UTC datetime (None stays None): refused with a clear message when it is
    naive, or when in UTC it falls outside the years 1 to 9999 (``0001-01-01T00:00:00+01:00`` is
    still in year 0 in UTC, which Python cannot represent)."""
    if since is None:
        return None
    if not isinstance(since, datetime) or since.tzinfo is None:
        msg = f"{name} must be a timezone-aware datetime (UTC), got {short_repr(since)}"
        raise ConfigurationError(msg)
    try:
        return since.astimezone(timezone.utc)
    except OverflowError:
        msg = (
            f"{name} {since.isoformat()} is out of range: in UTC it falls before 0001-01-01 or after 9999-12-31; "
            "give a time within those years (e.g. 0001-01-01T00:00:00+00:00 for everything)"
        )
        raise ConfigurationError(msg) from None


def _json_copy(value: Any) -> Any:
    # Hot path (every token dict of every record): exact-type checks first, ABCs only as fallback.
    t = type(value)
    if t is float:
        return value if math.isfinite(value) else None
    if t in _PLAIN:
        return value
    if t is dict or isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            try:
                out[str(k)] = _json_copy(v)
            except _NotJSONError as e:
                e.path.append(f"[{k!r}]")
                raise
        return out
    if t is list or t is tuple:
        items = []
        for i, v in enumerate(value):
            try:
                items.append(_json_copy(v))
            except _NotJSONError as e:
                e.path.append(f"[{i}]")
                raise
        return items
    if isinstance(value, numbers.Integral):  # numpy integers
        return int(value)
    if isinstance(value, numbers.Real):  # numpy floats
        x = float(value)
        return x if math.isfinite(x) else None
    raise _NotJSONError(value)


def _json_safe(value: Any, name: str) -> Any:
    """A JSON-ready copy of ``value``: non-finite floats become None, numpy scalars Python numbers."""
    try:
        return _json_copy(value)
    except _NotJSONError as e:
        where = name + "".join(reversed(e.path))
        msg = (
            f"{where} is {e.value!r} of type {type(e.value).__name__}, which the audit store cannot save as JSON; "
            "pass strings, numbers, None, lists and dicts (e.g. payloads.token_payload(token))"
        )
        raise ConfigurationError(msg) from None


def _check_text(value: Any, name: str, *, empty_ok: bool = True) -> str:
    if not isinstance(value, str) or (not empty_ok and not value.strip()):
        kind = "a string" if empty_ok else "a non-empty string"
        msg = f"{name} must be {kind}, got {short_repr(value)}"
        raise ConfigurationError(msg)
    return value


def _check_verdict_text(value: Any, name: str, *, empty_ok: bool = True) -> str:
    """A reviewer's text (name, note, edited answer): :func:`_check_text`, and no NUL character, which
    PostgreSQL's text cannot hold: a person's input is refused as such, never reported as an unreachable store."""
    text = _check_text(value, name, empty_ok=empty_ok)
    if "\x00" in text:
        msg = f"{name} contains a NUL character (\\x00), which the audit store cannot keep; remove it"
        raise ConfigurationError(msg)
    return text


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    """One guarded answer and the decision taken on it.

    Built from a guard's result with :meth:`from_result`; direct (keyword-only) construction is
    for records of other origins (tests, imports, adapters that decide outside the guard).

    ``reliability``: the response score the policy used, higher = more reliable (``None`` when
    undefined, e.g. an empty answer). ``attempts``: generations made for this answer (retries
    included). ``tokens``: one dict per generated token, a :class:`~logtoku_guard.wire.payloads.TokenPayload`.
    ``stats``: the statistics the policy saw, by name. ``timings``: durations in seconds, by
    name (e.g. ``{"total_s": 0.8, "generation_s": 0.7}``). ``tool_calls``: the answer's
    well-formed tool calls (:func:`from_result`, scored by :mod:`~logtoku_guard.scoring.tool_scores`) or
    the tool calls the record is about (a gated call waiting for review, or refused), each
    ``{"name", "args", "arguments"}`` plus ``"id"`` where the call has one: the tool, the argument
    values, and per argument its scores ``{"tokens", "mean_au", "mean_eu", "max_au", "max_eu",
    "logprob"}`` (AU/EU higher = more uncertain), with its ``quadrant`` and ``flagged`` (a rule
    fired on it) when the gate wrote it. ``review_id``: the review item of this record, set by the
    store (``AuditStore.record_for_review``, ``AuditStore.enqueue``).

    JSON has no NaN or infinity: non-finite floats in ``reliability``, ``tokens``, ``stats``,
    ``timings`` and ``tool_calls`` become ``None`` here, so a record read back from the store
    equals the one built. The lists and dicts are copied, never the caller's objects.
    """

    trace_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: datetime = field(default_factory=_utcnow)
    model: str
    policy_name: str
    policy_version: str
    prompt: str
    answer: str
    action: str
    reason: str
    rule: str | None = None
    reliability: float | None
    attempts: int = 1
    tokens: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, float | None] = field(default_factory=dict)
    timings: dict[str, float | None] = field(default_factory=dict)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    review_id: int | None = None

    def __post_init__(self) -> None:
        trace_id = _check_text(self.trace_id, "trace_id", empty_ok=False)
        if len(trace_id) > 64:
            msg = f"trace_id must be at most 64 characters, got {len(trace_id)}: {trace_id!r}; leave it to its default"
            raise ConfigurationError(msg)
        if not isinstance(self.created_at, datetime) or self.created_at.tzinfo is None:
            msg = f"created_at must be a timezone-aware datetime, got {self.created_at!r}; use datetime.now(timezone.utc)"
            raise ConfigurationError(msg)
        for name in ("model", "policy_name", "policy_version", "prompt", "answer", "reason"):
            _check_text(getattr(self, name), name)
        _check_text(self.action, "action", empty_ok=False)
        if self.rule is not None:
            _check_text(self.rule, "rule")
        reliability = self.reliability
        if reliability is not None and (isinstance(reliability, bool) or not isinstance(reliability, numbers.Real)):
            msg = f"reliability must be a float or None, got {self.reliability!r}"
            raise ConfigurationError(msg)
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 0:
            msg = f"attempts must be a non-negative integer, got {self.attempts!r}"
            raise ConfigurationError(msg)
        if not isinstance(self.tokens, (list, tuple)) or not all(isinstance(t, Mapping) for t in self.tokens):
            msg = f"tokens must be a list of dicts (payloads.token_payload(token)), got {self.tokens!r:.200}"
            raise ConfigurationError(msg)
        if not isinstance(self.tool_calls, (list, tuple)) or not all(isinstance(t, Mapping) for t in self.tool_calls):
            msg = f"tool_calls must be a list of dicts ({{id, name, args, arguments}}), got {self.tool_calls!r:.200}"
            raise ConfigurationError(msg)
        for name in ("stats", "timings"):
            if not isinstance(getattr(self, name), Mapping):
                msg = f"{name} must be a dict of name -> number, got {getattr(self, name)!r:.200}"
                raise ConfigurationError(msg)
        if self.review_id is not None and (isinstance(self.review_id, bool) or not isinstance(self.review_id, int)):
            msg = f"review_id must be an integer or None, got {self.review_id!r}"
            raise ConfigurationError(msg)
        set_ = partial(object.__setattr__, self)
        set_("created_at", self.created_at.astimezone(timezone.utc))
        set_("reliability", _json_safe(self.reliability, "reliability"))
        set_("tokens", _json_safe(self.tokens, "tokens"))
        set_("stats", _json_safe(self.stats, "stats"))
        set_("timings", _json_safe(self.timings, "timings"))
        set_("tool_calls", _json_safe(self.tool_calls, "tool_calls"))

    @classmethod
    def from_result(
        cls,
        result: GuardResult,
        *,
        question: str,
        thresholds: QuadrantThresholds | None = None,
        draft: str | None = None,
    ) -> AuditRecord:
        """The record of a guarded answer: the one way a guard (or an adapter) builds one.

        ``question``: what the user asked (the last user message, without retrieved context).
        ``thresholds``: the quadrant thresholds the guard used (``Guard.quadrants``), for each
        token's ``quadrant``. ``draft``: the answer to record when it is not the final
        generation's text (an adapter that synthesised its own response); by default
        ``result.generation.text``, the model's answer *before* the action (a disclaimer, an
        abstention message), so reviewers see what the model said.

        Built through :meth:`from_payload` from the result's
        :func:`~logtoku_guard.wire.payloads.result_payload`, so a record made from a result and one
        made from the same result's payload (a LangChain callback's event) are equal.
        """
        calls = [
            {"name": c.name, "args": c.args, "arguments": {k: a.as_dict() for k, a in c.arguments.items()}}
            for c in score_tool_calls(result.generation.tokens)
            if c is not None
        ]
        return cls.from_payload(result_payload(result, thresholds), question=question, draft=draft, tool_calls=calls)

    @classmethod
    def from_payload(
        cls,
        payload: ResultPayload,
        *,
        question: str,
        draft: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> AuditRecord:
        """The record of a guarded answer from its :class:`~logtoku_guard.wire.payloads.ResultPayload`.

        For an adapter that holds the payload rather than the :class:`GuardResult` (LangChain's
        ``logtoku_flagged`` event, ``response_metadata["logtoku_guard"]``). ``tokens`` are the
        payload's token dicts, ``stats`` the final decision's, ``timings`` the guard's durations
        in seconds (NaN -> None); ``answer`` is ``draft``, by default the payload's ``draft``
        (the model's answer before the action, so reviewers see what the model said).
        """
        return cls(
            trace_id=payload["trace_id"],
            model=payload["model"],
            policy_name=payload["policy"]["name"],
            policy_version=payload["policy"]["version"],
            prompt=question,
            answer=payload["draft"] if draft is None else draft,
            action=payload["action"],
            reason=payload["reason"],
            rule=payload["rule"],
            reliability=json_float(payload["reliability"]),
            attempts=payload["attempts"],
            tokens=[dict(t) for t in payload["tokens"]],
            stats=dict(payload["stats"]),
            timings={name: json_float(value) for name, value in payload["timings"].items()},
            tool_calls=list(tool_calls or []),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``created_at`` as an ISO 8601 string with ``+00:00``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["created_at"] = self.created_at.isoformat()
        return out


MAX_REVIEW_ID = 2**31 - 1
"""The largest review item id (the column is a 32-bit integer on PostgreSQL and SQLite alike)."""


def parse_review_id(text: str) -> int:
    """A review item id given as text (a URL path), bounded before Python parses it: anything but
    1 to :data:`MAX_REVIEW_ID` in ASCII digits names no item (:class:`UnknownReviewItemError`)."""
    from logtoku_guard.errors import UnknownReviewItemError

    digits = text.isascii() and text.isdigit() and len(text) <= len(str(MAX_REVIEW_ID))
    if not digits or not 1 <= int(text) <= MAX_REVIEW_ID:
        shown = text if len(text) <= 64 else text[:61] + "..."
        msg = f"no review item with id {shown}; ids are whole numbers from 1 to {MAX_REVIEW_ID}"
        raise UnknownReviewItemError(msg)
    return int(text)


@dataclass(frozen=True, kw_only=True)
class ReviewItem:
    """One answer waiting for (or given) a human verdict.

    ``claimed_by``/``claimed_at``: who took the item and when (also set by an approval or a
    rejection of a pending item). ``reviewer``/``decided_at``: who gave the verdict and when.
    ``claimed_os_user``/``reviewer_os_user``: the operating-system account that made the claim
    and gave the verdict, when the caller passed one (the CLI does); reviewer names are free
    text, the OS account is what the machine knew (see README, "Security and data").
    ``edited_answer``: the reviewer's corrected answer (approvals only), ``note``: the
    reviewer's comment (required for a rejection). All times are UTC. ``record``: the decision
    under review.
    """

    id: int
    trace_id: str
    status: ReviewStatus
    created_at: datetime
    claimed_by: str | None
    claimed_at: datetime | None
    reviewer: str | None
    decided_at: datetime | None
    edited_answer: str | None
    note: str | None
    record: AuditRecord
    claimed_os_user: str | None = None
    reviewer_os_user: str | None = None

    @property
    def decided(self) -> bool:
        """True once approved or rejected (final)."""
        return self.status in _DECIDED

    @property
    def final_answer(self) -> str | None:
        """The answer to deliver: the edited (else original) answer once approved, otherwise None."""
        if self.status != "approved":
            return None
        return self.edited_answer if self.edited_answer is not None else self.record.answer

    @property
    def answer_on_approval(self) -> str | None:
        """The text an approval releases: :attr:`final_answer` once approved, the recorded
        answer while undecided (an approval without an edit), None once rejected."""
        if self.status == "rejected":
            return None
        return self.final_answer if self.status == "approved" else self.record.answer


@dataclass(frozen=True)
class SkippedRow:
    """A stored row that could not be read and was left out of what a read returned.

    The store's rows are data: anything with write access to the database (a script, a repair,
    a damaged file) can leave a value its column's type cannot hold (``created_at='garbage'``, a
    number stored as text, bytes that are not UTF-8). Reads that return many rows skip such a row,
    log it (logger ``logtoku_guard.audit``) and list it here, so one bad row never takes down a
    whole listing. ``table``: ``audit_records`` or ``review_items``; ``row_id``: the row's id in
    that table (the review item id for ``review_items``); ``column``: the first unreadable
    column; ``value``: a short ``repr`` of what it holds; ``problem``: what it should be.
    """

    table: str
    row_id: int | None
    column: str
    value: str
    problem: str
    trace_id: str | None = None

    def describe(self) -> str:
        """``audit_records row 17 (trace 1f2e...): created_at holds 'garbage', not a date and time``."""
        trace = f" (trace {self.trace_id})" if self.trace_id else ""
        return f"{self.table} row {self.row_id}{trace}: {self.column} holds {self.value}, {self.problem}"

    def as_json(self) -> dict[str, object]:
        return {
            "table": self.table,
            "id": self.row_id,
            "trace_id": self.trace_id,
            "column": self.column,
            "value": self.value,
            "problem": self.problem,
        }


_T = TypeVar("_T")


class StoredRows(list[_T], Generic[_T]):
    """The rows a store read returned (a plain list), with :attr:`skipped`: the rows it could not
    read and left out (each a :class:`SkippedRow`; empty when every row was readable)."""

    def __init__(self, rows: Any = (), skipped: Any = ()) -> None:
        super().__init__(rows)
        self.skipped: list[SkippedRow] = list(skipped)


def unreadable_row_error(row: SkippedRow) -> UnreadableRowError:
    """The :class:`~logtoku_guard.errors.UnreadableRowError` of the one row asked for, naming it."""
    msg = f"the audit store's {row.describe()}; the row cannot be read. Fix or delete it with SQL (other rows are unaffected)"
    return UnreadableRowError(msg, row)


@dataclass(frozen=True)
class DecisionRow:
    """What drift statistics read of one record: when, which model and policy, the rule that fired
    (None: none), the action, and the statistics the policy saw (``None`` = undefined)."""

    created_at: datetime
    model: str
    policy: str
    rule: str | None
    action: str
    stats: dict[str, float | None]


@dataclass(frozen=True, kw_only=True)
class PurgeSummary:
    """What a purge removed (or, with ``dry_run``, would remove).

    ``records``: audit records. ``reviews``: their review items, by status. ``kept_undecided``:
    old records kept because their review item is still ``pending`` or ``claimed`` (purged only
    with ``include_undecided=True``). ``cutoff``: records created before this UTC time are old.
    """

    records: int
    reviews: dict[str, int]
    kept_undecided: int
    cutoff: datetime
    dry_run: bool


class RecordSink(Protocol):
    """Where a guard writes its decisions: what :class:`~logtoku_guard.guard.guard.Guard` needs from
    a store (:class:`~logtoku_guard.audit.AuditStore` is one; a test or another database can be)."""

    def record(self, rec: AuditRecord) -> str:
        """Save one record; its trace id."""
        ...

    def record_for_review(self, rec: AuditRecord) -> ReviewItem:
        """Save ``rec`` and queue it for a human; the queued item (its ``id`` goes into the answer)."""
        ...
