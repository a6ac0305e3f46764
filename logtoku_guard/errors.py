"""The exceptions of logtoku_guard: one root, every error names the bad value and the fix.

Hierarchy (every class is exported from ``logtoku_guard``)::

    LogTokUError                      root of everything this library raises on purpose
    ├── ConfigurationError (ValueError)   a bad argument or setting (K, thresholds, options)
    │   ├── InvalidPromptError            empty prompt, malformed chat messages
    │   │   └── PromptTooLongError        prompt does not fit the model's context window
    │   ├── PolicyError                   a policy (dict, YAML, JSON) that does not validate
    │   ├── DatasetUnavailableError       an evaluation dataset file is not where it should be
    │   ├── GrammarError                  a request's constraint (schema, tools) failed its own row while
    │   │                                 decoding (a grammar limit reached): that request alone fails
    │   └── LogProbsNotLogitsError        a remote server sends log-probabilities, not raw logits
    ├── UsageError                        the API used out of order (``.result`` of an unfinished stream, ...)
    ├── GuardRejectedError                the policy's ``raise`` action; carries the GuardResult
    │                                     (defined beside it, in :mod:`logtoku_guard.decision.results`)
    ├── ModelLoadError                    a model path or id that cannot be loaded locally
    ├── BackendError (RuntimeError)       a backend's native library cannot run here (llama.cpp's
    │                                     smoke decode died: signal, build and the rebuild to do)
    ├── MissingDependencyError (ImportError)  an optional package is not installed
    ├── NonFiniteLogitsError (ArithmeticError) the model produced NaN/inf among its top-K logits
    ├── RemoteServerError                 a remote server unreachable, refusing, or unreadable
    ├── AuditStoreError                   the audit store cannot be opened or written
    │   ├── UnknownTraceError (KeyError)  no audit record has that trace id
    │   └── UnreadableRowError            the one stored row asked for holds a value that cannot be
    │                                     read (edited by hand, damaged); names the row and column
    └── ReviewError                       a human-review queue operation that cannot be done
        ├── UnknownReviewItemError (KeyError)  no review item with that id
        ├── ReviewStateError              the item's status forbids it (decided twice, claimed by another)
        └── ReviewTimeoutError (TimeoutError)  no verdict arrived in time; carries the item
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


REPR_LIMIT = 80
"""Longest echo of a user-given value in an error message (longer ones are cut with "...")."""


def short_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters; a large container is summarised, never repr'd whole."""
    if isinstance(value, (dict, list, tuple, set, frozenset)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = repr(value)
    except RecursionError:  # a self-referencing container
        return f"<{type(value).__name__} nested too deeply to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class LogTokUError(Exception):
    """Root of every exception raised on purpose by logtoku_guard."""


class ConfigurationError(LogTokUError, ValueError):
    """A bad argument or setting; the message echoes the value and names the fix."""


class InvalidPromptError(ConfigurationError):
    """The prompt or chat messages cannot be used (empty, wrong roles, wrong types)."""


class PromptTooLongError(InvalidPromptError):
    """The prompt does not fit into the model's context window."""

    def __init__(self, prompt_tokens: int, context_window: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window
        super().__init__(
            f"prompt is {prompt_tokens} tokens but the model's context window is "
            f"{context_window} tokens; shorten the prompt (or the retrieved context) "
            f"to at most {context_window - 1} tokens"
        )


MESSAGE_LIMIT = 2000
"""Most characters of one validation message kept by :func:`bounded_message` (a list of allowed
values, such as the 25 statistic names, fits whole)."""

_QUOTED = re.compile(r"'[^']*'")


def bounded_message(msg: str, limit: int = MESSAGE_LIMIT) -> str:
    """``msg`` whole if it has at most ``limit`` characters; else cut after the last whole quoted
    item that fits (``'a', 'b' ... and 3 more``), never inside a value of a list; a message
    without such a point is cut at ``limit`` with ``...``. Bounds an echo of hostile input."""
    if len(msg) <= limit:
        return msg
    ends = [m.end() for m in _QUOTED.finditer(msg)]
    fitting = [end for end in ends if end <= limit]
    if not fitting:
        return msg[: limit - 3] + "..."
    more = len(ends) - len(fitting)
    return msg[: fitting[-1]] + (f" ... and {more} more" if more else " ...")


class PolicyError(ConfigurationError):
    """A policy that does not validate; the message names each bad field and value."""

    @classmethod
    def from_validation(cls, exc: ValidationError) -> PolicyError:
        errors = exc.errors()
        lines = []
        for err in errors[:20]:
            loc = ".".join(str(p) for p in err["loc"])
            loc = loc if len(loc) <= 120 else loc[:117] + "..."
            msg = bounded_message(err["msg"])
            lines.append(f"{loc or '<policy>'}: {msg} (got {short_repr(err.get('input'))})")
        if len(errors) > 20:
            lines.append(f"... and {len(errors) - 20} more error(s)")
        return cls("invalid policy:\n  " + "\n  ".join(lines))


class DatasetUnavailableError(ConfigurationError):
    """A dataset file is not where it should be (the message names the path and the fix)."""


class GrammarError(ConfigurationError):
    """A row's grammar failed while decoding (a resource limit of the grammar engine, a rejected token).

    Raised for that row's request alone: the other rows of a batch go on. The cause is the
    request's constraint (a schema or tools the engine cannot follow), so the server answers 400.
    """


class UsageError(LogTokUError):
    """The API was used out of order: e.g. reading ``.result`` of a guarded stream before it ended.

    The message says what to do first.
    """


class LogProbsNotLogitsError(ConfigurationError):
    """The server's ``top_logprobs`` values are log-probabilities, not raw logits."""


class RemoteServerError(LogTokUError):
    """The server could not be reached, refused the request, or sent something unreadable."""


class ModelLoadError(LogTokUError):
    """A model id or folder that cannot be loaded from local files."""


class BackendError(LogTokUError, RuntimeError):
    """A backend's native code cannot run on this machine (a build for instructions the CPU lacks).

    Raised before the first decode in the user's process, from a check run in a subprocess, so
    that a native crash (``SIGILL``, ``SIGSEGV``) is an error naming the cause instead of the end
    of the process.
    """


class MissingDependencyError(LogTokUError, ImportError):
    """An optional dependency is missing; the message gives the exact install command."""


class NonFiniteLogitsError(LogTokUError, ArithmeticError):
    """The model produced NaN or infinite values among its top-K raw logits."""

    def __init__(self, step: int, row: int, values: list[float]) -> None:
        self.step = step
        self.row = row
        self.values = values
        super().__init__(
            f"the model produced non-finite top-K logits {values} at generation step {step} "
            f"(batch row {row}); this usually means a float16 overflow or broken weights: "
            "load the model with dtype='float32' or 'bfloat16' and check its checkpoint"
        )


class AuditStoreError(LogTokUError):
    """The audit store cannot be opened or written; the message names the path or URL and the fix."""


class UnknownTraceError(AuditStoreError, KeyError):
    """No audit record has this trace id."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class UnreadableRowError(AuditStoreError):
    """The one stored row asked for (a review item, a record by trace id) holds a value that cannot be
    read; ``row`` is the :class:`~logtoku_guard.audit.records.SkippedRow` naming its table, id, column
    and value. The store itself is reachable: other rows still read."""

    def __init__(self, message: str, row: Any) -> None:
        super().__init__(message)
        self.row = row


class ReviewError(LogTokUError):
    """Base of the errors of the human-review queue."""


class UnknownReviewItemError(ReviewError, KeyError):
    """No review item has this id."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class ReviewStateError(ReviewError):
    """The review item's current status forbids the operation (already decided, claimed by someone else)."""


class ReviewTimeoutError(ReviewError, TimeoutError):
    """No verdict arrived within the timeout; ``item`` is the
    :class:`~logtoku_guard.audit.ReviewItem` as last read (still open)."""

    def __init__(self, message: str, item: Any) -> None:
        super().__init__(message)
        self.item = item
