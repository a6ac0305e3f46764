"""Who is acting on the review page: tokens, sessions and CSRF tokens.

Login is by token, as in Jupyter: ``/?token=...`` with the admin token printed by
``logtoku-guard review serve`` (acts as ``admin``, may do everything) or a reviewer's personal
token (``logtoku-guard review add-reviewer NAME``; acts as that reviewer), or the sign-in form.
A token in the URL logs in at once only when the browser says the address was opened by the
person (``Sec-Fetch-Site: none``: typed, pasted, a bookmark) or by this site; a link from
another site (or a browser that does not say) gets a confirmation page naming the account
instead, so another site cannot sign a reviewer into its own account (login CSRF). The sign-in
form and the confirmation page post to ``/login`` with a one-time nonce that must match a
``SameSite=Strict`` cookie set with the form. A valid token opens a
server-side session whose random id travels in a cookie (``HttpOnly``, ``SameSite=Strict``,
``Secure`` over HTTPS), then the browser is redirected to the same page without the token, so
it leaves the address bar and the history. Every session has its own CSRF token, put in every
form and checked (in constant time) on every POST.

Sessions live in the server's memory: restarting ``serve`` logs everybody out (and prints a
new admin token).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from logtoku_guard.audit.reviewers import ADMIN_NAME, ReviewerRegistry

__all__ = ["SESSION_COOKIE", "Session", "SessionStore"]

SESSION_COOKIE = "logtoku_review_session"


@dataclass(frozen=True)
class Session:
    """A logged-in person: ``actor`` is the name recorded with their claims and verdicts."""

    id: str
    actor: str
    is_admin: bool
    csrf_token: str
    expires_at: float

    def csrf_ok(self, presented: object) -> bool:
        """True when ``presented`` is this session's CSRF token (constant-time comparison)."""
        return isinstance(presented, str) and hmac.compare_digest(presented.encode(), self.csrf_token.encode())


class SessionStore:
    """The admin token, the reviewer accounts, and the open sessions (thread-safe)."""

    def __init__(self, admin_token: str, registry: ReviewerRegistry, *, max_age_s: float = 12 * 3600) -> None:
        self.admin_token = admin_token
        self.registry = registry
        self.max_age_s = max_age_s
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def identify(self, token: str) -> tuple[str, bool] | None:
        """Whose token this is, as ``(actor, is_admin)``, or None when it is nobody's; opens no session."""
        if hmac.compare_digest(token.encode(), self.admin_token.encode()):
            return ADMIN_NAME, True
        reviewer = self.registry.authenticate(token)
        return None if reviewer is None else (reviewer.name, False)

    def login(self, token: str) -> Session | None:
        """A new session for this token, or None when it is nobody's."""
        who = self.identify(token)
        if who is None:
            return None
        actor, is_admin = who
        session = Session(
            id=secrets.token_urlsafe(32),
            actor=actor,
            is_admin=is_admin,
            csrf_token=secrets.token_urlsafe(32),
            expires_at=time.monotonic() + self.max_age_s,
        )
        with self._lock:
            self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The open session with this id; expired sessions and disabled reviewers count as none."""
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires_at < time.monotonic():
                del self._sessions[session_id]
                session = None
        if session is not None and not session.is_admin and not self.registry.is_active(session.actor):
            self.logout(session.id)
            return None
        return session

    def logout(self, session_id: str) -> None:
        """Close a session (unknown ids are ignored)."""
        with self._lock:
            self._sessions.pop(session_id, None)
