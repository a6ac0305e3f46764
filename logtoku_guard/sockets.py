"""Listening sockets for the two servers (``serve`` and ``review serve``): bound before anything
is printed or loaded, so a port in use is a clear error instead of a URL that never answers."""

from __future__ import annotations

import errno
import socket

from logtoku_guard.errors import ConfigurationError

__all__ = ["bind_socket", "check_port"]


def check_port(port: int, *, allow_any: bool = False, default: int = 8000) -> int:
    """``port`` if it is a TCP port (1 to 65535; 0 too, meaning any free port, with ``allow_any``);
    else a ConfigurationError naming the value and the fix."""
    low = 0 if allow_any else 1
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
        any_free = ", or 0 for any free port" if allow_any else ""
        msg = f"--port must be a TCP port from 1 to 65535, got {port!r}; the default is {default}{any_free}"
        raise ConfigurationError(msg)
    return port


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: a free one), not yet listening.

    Raises :class:`ConfigurationError` naming the address and the fix when it cannot be bound
    (the port in use, a privileged port, an address not on this machine, a host name that
    does not resolve).
    """
    check_port(port, allow_any=True)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        msg = f"cannot resolve --host {host!r} ({exc}); pass an IP address such as 127.0.0.1"
        raise ConfigurationError(msg) from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # rebind at once after a restart (TIME_WAIT)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            msg = f"port {port} on {host} is already in use (another server listens there); stop it, or pick another --port"
        elif exc.errno == errno.EACCES:
            msg = f"no permission to listen on port {port} of {host} (ports below 1024 need privileges); use a --port >= 1024"
        else:
            msg = f"cannot listen on {host}:{port} ({exc.strerror or exc}); check --host and --port"
        raise ConfigurationError(msg) from exc
    return sock
