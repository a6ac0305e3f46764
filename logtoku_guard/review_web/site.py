"""The review web app (Starlette + Jinja2, server-rendered, no JavaScript): queue, item, actions.

Routes: ``POST /login`` (the sign-in form); ``GET /`` the queue (``view`` = pending / claimed /
decided / all, ``rule``, ``model``, ``min_age_h``, ``max_age_h``, ``page``, ``per_page``);
``GET /items/{id}`` one item;
``POST /items/{id}/claim|approve|reject|release``; ``GET|POST /reviewers`` (admin: the
accounts); ``POST /logout``; ``GET /static/review.css``.

Safety: every page needs a session (:mod:`~logtoku_guard.review_web.auth`), every POST its
CSRF token (else 403) and, when the browser sends one, a same-origin ``Origin``. Jinja2
autoescapes every stored text, every printed text shows its control and invisible characters as
escapes (:func:`~logtoku_guard.review_web.views.visible`), and the Content-Security-Policy allows
no script at all. The store's own rules decide races: a claim or verdict the store refuses
(:class:`~logtoku_guard.errors.ReviewStateError`) becomes a 409 page. Bad query or path values
are 400 or 404 pages, and an audit store that cannot be reached (its database server down) a
503 page saying so, on every route. A stored row that cannot be read (edited by hand, damaged) is
left off the queue with a notice naming it, and its own item page is a 422 page naming the row,
the column and the value: one bad row never takes down a view.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from logtoku_guard.audit.records import parse_review_id
from logtoku_guard.audit.reviewers import ReviewerRegistry
from logtoku_guard.audit.store import AuditStore
from logtoku_guard.errors import (
    AuditStoreError,
    ConfigurationError,
    ReviewStateError,
    UnknownReviewItemError,
    UnreadableRowError,
    short_repr,
)
from logtoku_guard.review_web import views
from logtoku_guard.review_web.auth import SESSION_COOKIE, Session, SessionStore
from logtoku_guard.review_web.queue_page import QueueFilter, list_queue

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

LOGIN_COOKIE = "logtoku_review_login"
"""The sign-in form's nonce (``SameSite=Strict``, only sent to ``/login``, 10 minutes)."""
_LOGIN_FORM_S = 600
_HERE = Path(__file__).parent
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class _HTTPError(Exception):
    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def _float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise _HTTPError(400, "Bad filter", f"{name} must be a number of hours, got {short_repr(raw)}") from None


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        raise _HTTPError(400, "Bad page", f"{name} must be an integer, got {short_repr(raw)}") from None


def _text_param(request: Request, name: str) -> str | None:
    raw = request.query_params.get(name) or None
    if raw is not None and "\x00" in raw:
        raise _HTTPError(400, "Bad filter", f"{name} must not contain NUL characters, got {short_repr(raw)}")
    return raw


_NOBODYS_TOKEN = "this token is nobody's: use the URL printed by `review serve` or your own reviewer token"


class ReviewApp:
    """The app's state (store, sessions, templates) and its handlers; :func:`create_app` wires them."""

    def __init__(self, store: AuditStore, admin_token: str) -> None:
        self.store = store
        self.registry = ReviewerRegistry(store)
        self.sessions = SessionStore(admin_token, self.registry)
        self.env = Environment(
            loader=FileSystemLoader(_HERE / "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            finalize=views.visible,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(
            fmt_num=views.fmt_num, fmt_time=views.fmt_time, legend=views.QUADRANT_LEGEND, has_hidden=views.has_hidden
        )
        self.env.filters["form_value"] = views.FormValue

    # -- plumbing

    def render(self, name: str, session: Session | None, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(session=session, **context)
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    def error_page(self, session: Session | None, status: int, title: str, message: str) -> HTMLResponse:
        return self.render("error.html", session, status=status, title=title, message=message)

    async def dispatch(self, request: Request) -> Response:
        """Authenticate, check CSRF on POST, call the route's handler, map errors to pages."""
        session: Session | None = None
        try:
            if request.scope["endpoint_name"] == "login":
                return await self._login_form(request)
            token = request.query_params.get("token")
            if token is not None:
                return self._token_in_url(request, token)
            session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
            if session is None:
                return self._sign_in_page(request, 401)
            form: dict[str, str] = {}
            if request.method == "POST":
                self._check_origin(request)
                form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
                if not session.csrf_ok(form.get("csrf_token")):
                    raise _HTTPError(403, "Forbidden", "the form's CSRF token is missing or wrong; reload the page and try again")
            handler = request.scope["endpoint_name"]
            return await getattr(self, handler)(request, session, form)
        except _HTTPError as e:
            return self.error_page(session, e.status, e.title, e.message)
        except ReviewStateError as e:
            return self.error_page(session, 409, "Conflict", str(e))
        except UnknownReviewItemError as e:
            return self.error_page(session, 404, "Not found", str(e))
        except ConfigurationError as e:
            return self.error_page(session, 400, "Bad request", str(e))
        except UnreadableRowError as e:  # one bad row: this page only, the store and other items are fine
            logger.warning("review page %s %s: %s", request.method, request.url.path, e)
            return self.error_page(session, 422, "Unreadable item", str(e))
        except AuditStoreError as e:
            logger.warning("review page %s %s: %s", request.method, request.url.path, e)
            page = self.error_page(
                session,
                503,
                "Audit store unreachable",
                "the audit store cannot be reached right now (is its database server running?); nothing was changed. "
                "Try again in a moment; the server's log has the details.",
            )
            page.headers["Retry-After"] = "10"
            return page

    @staticmethod
    def _check_origin(request: Request) -> None:
        origin = request.headers.get("origin")
        if origin is not None and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
            raise _HTTPError(403, "Forbidden", "this form was posted from another site")

    @staticmethod
    def _local_target(target: str | None) -> str:
        """``target`` if it is a path on this site, else ``/``."""
        if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
            return "/"
        return target

    def _with_login_nonce(self, response: HTMLResponse, nonce: str) -> HTMLResponse:
        response.set_cookie(LOGIN_COOKIE, nonce, max_age=_LOGIN_FORM_S, httponly=True, samesite="strict", path="/login")
        return response

    def _sign_in_page(self, request: Request, status: int) -> Response:
        nonce = secrets.token_urlsafe(24)
        target = self._local_target(request.url.path + ("?" + request.url.query if request.url.query else ""))
        page = self.render("login.html", None, status=status, nonce=views.FormValue(nonce), target=views.FormValue(target))
        return self._with_login_nonce(page, nonce)

    def _token_in_url(self, request: Request, token: str) -> Response:
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = request.url.path + ("?" + urlencode(rest) if rest else "")
        if request.headers.get("sec-fetch-site") in ("none", "same-origin"):  # opened by the person, or by this site
            return self._login(request, token, target)
        who = self.sessions.identify(token)  # a link from another site, or a browser that does not say: ask first
        if who is None:
            raise _HTTPError(403, "Invalid token", _NOBODYS_TOKEN)
        nonce = secrets.token_urlsafe(24)
        page = self.render(
            "confirm_login.html",
            None,
            actor=who[0],
            is_admin=who[1],
            token=views.FormValue(token),
            nonce=views.FormValue(nonce),
            target=views.FormValue(target),
        )
        return self._with_login_nonce(page, nonce)

    async def _login_form(self, request: Request) -> Response:
        """``POST /login``: the sign-in form or the confirmation page, with its nonce."""
        self._check_origin(request)
        if request.headers.get("sec-fetch-site") not in (None, "same-origin"):
            raise _HTTPError(403, "Forbidden", "this sign-in form was posted from another site")
        form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
        nonce, expected = form.get("nonce", ""), request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(nonce.encode(), expected.encode()):
            raise _HTTPError(
                403, "Forbidden", "this sign-in form is stale or was not opened here; reload the sign-in page and try again"
            )
        response = self._login(request, form.get("token", ""), self._local_target(form.get("target")))
        response.delete_cookie(LOGIN_COOKIE, path="/login")
        return response

    def _login(self, request: Request, token: str, target: str) -> Response:
        session = self.sessions.login(token)
        if session is None:
            raise _HTTPError(403, "Invalid token", _NOBODYS_TOKEN)
        response = RedirectResponse(target, status_code=303, headers=_HEADERS)
        response.set_cookie(
            SESSION_COOKIE,
            session.id,
            max_age=int(self.sessions.max_age_s),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    def _redirect_item(self, item_id: int) -> Response:
        return RedirectResponse(f"/items/{item_id}", status_code=303, headers=_HEADERS)

    @staticmethod
    def _item_id(request: Request) -> int:
        """The path's item id, bounded before anything parses or queries it (no item has any other)."""
        return parse_review_id(str(request.path_params["item_id"]))

    # -- pages

    async def queue(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        view = request.query_params.get("view", "pending")
        flt = QueueFilter(
            view=view,  # type: ignore[arg-type]  # checked by QueueFilter
            rule=_text_param(request, "rule"),
            model=_text_param(request, "model"),
            min_age_h=_float_param(request, "min_age_h"),
            max_age_h=_float_param(request, "max_age_h"),
            page=_int_param(request, "page", 1),
            per_page=_int_param(request, "per_page", 50),
        )
        page = list_queue(self.store, flt)
        base = {k: v for k, v in request.query_params.items() if k != "page" and v}

        def link(**changes: Any) -> str:
            return "/?" + urlencode({**base, **{k: v for k, v in changes.items() if v is not None}})

        return self.render("queue.html", session, flt=flt, page=page, n_pages=page.pages(flt.per_page), link=link)

    async def item(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        item = self.store.review_item(self._item_id(request))
        rec = item.record
        return self.render(
            "item.html",
            session,
            item=item,
            rec=rec,
            answer=views.answer_view(item),
            tool_calls=views.tool_call_views(rec.tool_calls),
            gated_call=views.is_gated_call(rec),
            history=views.history(item),
            checks=getattr(rec, "checks", None) or [],
            passages=getattr(rec, "passages", None) or [],
            can_release=item.status == "claimed",
            blocked=item.status == "claimed" and item.claimed_by != session.actor,
        )

    # -- actions (POST)

    async def claim(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        item_id = self._item_id(request)
        self.store.claim(item_id, session.actor)
        return self._redirect_item(item_id)

    async def approve(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        item_id = self._item_id(request)
        edited = form.get("edited_answer")
        current = self.store.review_item(item_id).record.answer
        if edited is not None:
            edited = edited.replace("\r\n", "\n")
        if edited is not None and (edited == current or not edited.strip()):
            edited = None  # unchanged (or emptied): approve the answer as it is
        note = (form.get("note") or "").strip() or None
        self.store.approve(item_id, session.actor, edited_answer=edited, note=note)
        return self._redirect_item(item_id)

    async def reject(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        item_id = self._item_id(request)
        self.store.reject(item_id, session.actor, form.get("note", ""))
        return self._redirect_item(item_id)

    async def release(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        item_id = self._item_id(request)
        item = self.store.review_item(item_id)
        if not session.is_admin and item.claimed_by != session.actor:
            raise _HTTPError(403, "Forbidden", f"only {item.claimed_by!r} or the admin may release this claim")
        self.store.release(item_id, session.actor, force=session.is_admin)
        return self._redirect_item(item_id)

    async def reviewers(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        if not session.is_admin:
            raise _HTTPError(403, "Forbidden", "only the admin (the token printed by `review serve`) manages reviewers")
        new_token = new_name = None
        if request.method == "POST":
            if form.get("disable"):
                self.registry.set_disabled(form["disable"], True)
            elif form.get("enable"):
                self.registry.set_disabled(form["enable"], False)
            else:
                reviewer, new_token = self.registry.add(form.get("name", "").strip())
                new_name = reviewer.name
        return self.render("reviewers.html", session, reviewers=self.registry.list(), new_name=new_name, new_token=new_token)

    async def logout(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        self.sessions.logout(session.id)
        response = RedirectResponse("/", status_code=303, headers=_HEADERS)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response


def create_app(store: AuditStore, admin_token: str) -> Starlette:
    """The review web app over ``store``; ``admin_token`` logs in as the admin (keep it secret)."""
    if not isinstance(admin_token, str) or len(admin_token) < 16:
        msg = "admin_token must be a random string of at least 16 characters, e.g. secrets.token_urlsafe(32)"
        raise ConfigurationError(msg)
    state = ReviewApp(store, admin_token)

    def route(path: str, name: str, methods: list[str]) -> Route:
        async def endpoint(request: Request) -> Response:
            request.scope["endpoint_name"] = name
            return await state.dispatch(request)

        return Route(path, endpoint, methods=methods, name=name)

    async def css(request: Request) -> Response:
        return FileResponse(_HERE / "templates" / "review.css", media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    routes = [
        route("/login", "login", ["POST"]),
        route("/", "queue", ["GET"]),
        # {item_id} as text: Starlette's int converter fails (500) on an id of thousands of digits
        route("/items/{item_id}", "item", ["GET"]),
        *(route(f"/items/{{item_id}}/{verb}", verb, ["POST"]) for verb in ("claim", "approve", "reject", "release")),
        route("/reviewers", "reviewers", ["GET", "POST"]),
        route("/logout", "logout", ["POST"]),
        Route("/static/review.css", css, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.review = state
    return app
