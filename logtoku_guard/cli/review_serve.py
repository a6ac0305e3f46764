"""``logtoku-guard review serve`` and ``logtoku-guard review add-reviewer`` (typer commands).

Registered by :mod:`logtoku_guard.cli.review_commands` as ``review_app.command("serve")(serve)`` and
``review_app.command("add-reviewer")(add_reviewer)``. Starlette, Jinja2 and uvicorn (the
``review`` extra) are imported only when ``serve`` runs.
"""

from __future__ import annotations

import ipaddress
import math
import secrets
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

import logtoku_guard.cli._common as _common
from logtoku_guard.cli._common import StoreOpt
from logtoku_guard.errors import ConfigurationError, LogTokUError, MissingDependencyError
from logtoku_guard.sockets import bind_socket, check_port

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditStore

__all__ = ["add_reviewer", "check_claim_ttl", "is_loopback", "serve"]


def is_loopback(host: str) -> bool:
    """True when ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


MAX_CLAIM_TTL_MIN = 366 * 24 * 60.0
"""The longest ``--claim-ttl`` (a year, in minutes); leave the option out for claims that never expire."""


def check_claim_ttl(minutes: float | None) -> None:
    """``--claim-ttl`` is a finite number of minutes from 0.1 to a year; else a ConfigurationError."""
    if minutes is not None and not (math.isfinite(minutes) and 0.1 <= minutes <= MAX_CLAIM_TTL_MIN):
        msg = (
            f"--claim-ttl {minutes:g} is not a usable number of minutes; give one from 0.1 to {MAX_CLAIM_TTL_MIN:g} "
            "(a year), e.g. --claim-ttl 30, or leave it out so that claims never expire"
        )
        raise ConfigurationError(msg)


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
    port: Annotated[int, typer.Option(help="TCP port, 1 to 65535; 0 picks a free one (the printed URL shows it).")] = 8321,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Listen on a non-loopback address (put it behind TLS: a reverse proxy).")
    ] = False,
    claim_ttl: Annotated[
        float | None, typer.Option("--claim-ttl", help="Minutes (0.1 to a year) after which a claim expires; default: never.")
    ] = None,
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
        check_port(port, allow_any=True, default=8321)
        check_claim_ttl(claim_ttl)
    except ConfigurationError as e:
        raise _common.fail(e) from e
    try:
        import uvicorn

        from logtoku_guard.review_web.site import create_app
    except ImportError as e:
        raise _common.fail(
            MissingDependencyError(f"the review page needs the review extra ({e}); pip install 'logtoku-guard[review]'")
        ) from e
    token = secrets.token_urlsafe(32)
    try:
        audit = _open(store, claim_ttl)
    except LogTokUError as e:
        raise _common.fail(e) from e
    try:
        app = create_app(audit, token)
        sock = bind_socket(host, port)
    except LogTokUError as e:
        audit.close()
        raise _common.fail(e) from e
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = socket.gethostname()
    typer.echo(f"http://{shown}:{sock.getsockname()[1]}/?token={token}")
    try:
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", server_header=False))
        server.run(sockets=[sock])
    finally:
        sock.close()
        audit.close()


def add_reviewer(
    name: Annotated[str, typer.Argument(help="The reviewer's name, recorded with their verdicts.")],
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"name": ..., "token": ...} as one JSON object.')] = False,
) -> None:
    """Create a reviewer account and print its personal token (shown once, stored hashed)."""
    from logtoku_guard.audit.reviewers import ReviewerRegistry

    try:
        with _common.open_store(store) as audit:
            reviewer, token = ReviewerRegistry(audit).add(name)
    except LogTokUError as e:
        raise _common.fail(e) from e
    if as_json:
        _common.print_json({"name": reviewer.name, "token": token})
        return
    typer.echo(f"token of reviewer {reviewer.name} (shown once; give it to them privately, it signs them in): {token}")
