"""Calling a user's retriever safely: a worker thread, a timeout, and clear errors for bad results.

:func:`call_retriever` runs ``retrieve(query)`` (or a plain callable) in a daemon thread with
the caller's context variables (so LangChain/LlamaIndex tracing follows), waits at most
``timeout_s`` seconds, and turns the result into passage strings. A retriever that does not
answer in time is *abandoned*: Python cannot stop a thread, so it keeps running in the
background until it returns (its result is dropped); being a daemon thread, it never keeps
the interpreter from exiting. A retriever that returns a ``str`` (which would be split into
characters) is a :class:`~logtoku_guard.errors.ConfigurationError`.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from logtoku_guard.errors import ConfigurationError, short_repr

__all__ = ["Retriever", "RetrieverLike", "call_retriever", "passage_text"]

logger = logging.getLogger(__name__)


@runtime_checkable
class Retriever(Protocol):
    """Anything with ``retrieve(query) -> passages``; a plain callable works too."""

    def retrieve(self, query: str) -> Sequence[Any]: ...


RetrieverLike = Retriever | Callable[[str], Sequence[Any]]


def passage_text(p: Any) -> str:
    """The text of one retrieved passage (a string, or an object with .page_content / .text / .content)."""
    for attr in ("page_content", "text", "content"):
        value = getattr(p, attr, None)
        if isinstance(value, str):
            return value
    if isinstance(p, str):
        return p
    msg = f"a retriever returned {type(p).__name__} ({short_repr(p)}); return strings or objects with .text / .page_content"
    raise ConfigurationError(msg)


def call_retriever(retriever: RetrieverLike, question: str, timeout_s: float, limit: int) -> tuple[list[str], str | None]:
    """At most ``limit`` passages for ``question``: ``(passages, None)`` or ``([], why)``.

    ``why``: the retriever's exception (logged), "the retriever did not answer within N s",
    or "the retriever returned nothing". Raises :class:`ConfigurationError` when the result is
    a string, or holds items that are neither strings nor documents.
    """
    fn = retriever.retrieve if isinstance(retriever, Retriever) else retriever
    box: dict[str, Any] = {}
    done = threading.Event()
    ctx = contextvars.copy_context()  # tracing context (LangChain callbacks...) follows the call

    def work() -> None:
        try:
            box["found"] = ctx.run(fn, question)
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name="logtoku-guard-retriever", daemon=True).start()
    if not done.wait(timeout_s):
        logger.warning("the retriever did not answer within %g s for %r; the thread is abandoned", timeout_s, question)
        return [], f"the retriever did not answer within {timeout_s:g} s"
    error = box.get("error")
    if isinstance(error, Exception):  # recorded in the decision and the audit trail, and logged
        logger.warning("retriever failed for %r: %s", question, error, exc_info=error)
        return [], f"the retriever failed: {error.__class__.__name__}: {error}"
    if error is not None:  # KeyboardInterrupt, SystemExit: not ours to record
        raise error
    result = box["found"]
    if isinstance(result, (str, bytes)):
        msg = (
            f"the retriever returned a {type(result).__name__} ({short_repr(result, 60)}), not a list of passages; "
            "return a list of strings (or of objects with .text / .page_content), e.g. [text]"
        )
        raise ConfigurationError(msg)
    try:
        found = [passage_text(p) for p in itertools.islice(result, limit)]
    except ConfigurationError:
        raise
    except Exception as exc:  # not iterable: recorded like a failure
        logger.warning("retriever returned %s for %r: %s", type(result).__name__, question, exc)
        return [], f"the retriever failed: {exc.__class__.__name__}: {exc}"
    if not found:
        return [], "the retriever returned nothing"
    return found, None
