"""The review web page: ``logtoku-guard review serve`` (behind the ``review`` extra).

- :mod:`~logtoku_guard.review_web.site`: :func:`create_app`, the Starlette app (queue, item,
  actions, reviewer accounts), server-rendered Jinja2 templates with autoescaping, no JavaScript.
- :mod:`~logtoku_guard.review_web.auth`: token login, sessions (HttpOnly, SameSite=Strict
  cookie) and per-session CSRF tokens.
- :mod:`~logtoku_guard.review_web.queue_page`: the paginated, filtered queue query.
- :mod:`~logtoku_guard.review_web.views`: the released answer and its AU/EU heat-map.
- the CLI commands ``review serve`` and ``review add-reviewer`` live in :mod:`logtoku_guard.cli.review_serve`.

Reviewer accounts live in :mod:`logtoku_guard.audit.reviewers`, waiting for a verdict in
:mod:`logtoku_guard.audit.waiting`. Nothing here is imported by ``import logtoku_guard``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logtoku_guard.review_web.site import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from logtoku_guard.review_web.site import create_app

        return create_app
    msg = f"module 'logtoku_guard.review_web' has no attribute {name!r}"
    raise AttributeError(msg)
