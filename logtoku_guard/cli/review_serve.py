"""``logtoku-guard review serve`` and ``logtoku-guard review add-reviewer`` (typer commands).

Registered by :mod:`logtoku_guard.cli.review` as ``review_app.command("serve")(serve)`` and
``review_app.command("add-reviewer")(add_reviewer)``. Starlette, Jinja2 and uvicorn (the
``review`` extra) are imported only when ``serve`` runs.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

import logtoku_guard.cli._common as _common
from logtoku_guard.cli._common import StoreOpt
from logtoku_guard.errors import LogTokUError, MissingDependencyError

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditStore

__all__ = ["add_reviewer", "is_loopback", "serve"]


def is_loopback(host: str) -> bool:
    """True when ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _open(store: str | None, claim_ttl_min: float | None) -> AuditStore:
    if claim_ttl_min is None:
        return _common.open_store(store)
    from logtoku_guard.audit import AuditStore

    target = store
    if target is None:  # the default, audit.db in the cache
        with _common.open_store(None) as default:
            target = default.url
    return AuditStore(target, claim_ttl=timedelta(minutes=claim_ttl_min))


def serve(
    store: StoreOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on; only loopback without --allow-remote.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8321,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Listen on a non-loopback address (put it behind TLS: a reverse proxy).")
    ] = False,
    claim_ttl: Annotated[float | None, typer.Option("--claim-ttl", help="Minutes after which a claim expires.", min=0.1)] = None,
) -> None:
    """Serve the review web page; prints one line: the URL with the admin access token."""
    if not is_loopback(host) and not allow_remote:
        raise _common.fail(
            LogTokUError(
                f"--host {host} is reachable from other machines; pass --allow-remote to do it on purpose "
                "(and put the page behind TLS), or keep the default 127.0.0.1"
            )
        )
    try:
        import uvicorn

        from logtoku_guard.review_web.app import create_app
    except ImportError as e:
        raise _common.fail(
            MissingDependencyError(f"the review page needs the review extra ({e}); pip install 'logtoku-guard[review]'")
        ) from e
    token = secrets.token_urlsafe(32)
    try:
        audit = _open(store, claim_ttl)
        app = create_app(audit, token)
    except LogTokUError as e:
        raise _common.fail(e) from e
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = socket.gethostname()
    typer.echo(f"http://{shown}:{port}/?token={token}")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)
    finally:
        audit.close()


def add_reviewer(
    name: Annotated[str, typer.Argument(help="The reviewer's name, recorded with their verdicts.")], store: StoreOpt = None
) -> None:
    """Create a reviewer account and print its personal token (shown once, stored hashed)."""
    from logtoku_guard.audit.reviewers import ReviewerRegistry

    try:
        with _common.open_store(store) as audit:
            _reviewer, token = ReviewerRegistry(audit).add(name)
    except LogTokUError as e:
        raise _common.fail(e) from e
    typer.echo(token)
