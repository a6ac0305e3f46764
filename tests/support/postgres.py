"""A throwaway PostgreSQL server for the tests of the audit store (Debian's ``postgresql`` package).

:func:`start_server` runs ``initdb`` into a new temporary folder (trust authentication, one
superuser), then ``pg_ctl start`` on a free port of 127.0.0.1 with its unix socket in that same
folder; :meth:`PostgresServer.stop` runs ``pg_ctl stop -m immediate`` and removes the folder.
``initdb`` refuses to run as root: as root, the server runs as the ``postgres`` account of the
Debian package, or as a system account ``logtoku_pg`` created for it (``useradd --system``).
The server trades durability for speed (``fsync=off``): the tests kill clients, never it.

:func:`postgres_server` is the session fixture (import it into a test module). It skips the
tests when no server can be started (no ``initdb``, no psycopg, initdb failing), with the
reason, except under CI (``$CI`` set to ``true``/``1``), where that is a test error: CI must
run them. ``$LOGTOKU_GUARD_PG_BINDIR`` names the folder of ``initdb``/``pg_ctl`` when they are
elsewhere than on ``PATH`` or in ``/usr/lib/postgresql/<version>/bin``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SUPERUSER = "logtoku"
"""The server's superuser (trust authentication from 127.0.0.1 and the socket)."""


class ServerUnavailable(RuntimeError):
    """No PostgreSQL server could be started here (the message says why)."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def find_bindir() -> Path:
    env = os.environ.get("LOGTOKU_GUARD_PG_BINDIR")
    candidates = [Path(env)] if env else []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    versions = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p).parent.name.isdigit()]
    candidates += sorted(versions, key=lambda p: int(p.parent.name), reverse=True)  # the newest first
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    msg = (
        "no initdb/pg_ctl found (install Debian's postgresql package: apt-get install -y postgresql, "
        "or set $LOGTOKU_GUARD_PG_BINDIR)"
    )
    raise ServerUnavailable(msg)


def _server_account() -> str | None:
    """The unprivileged account that runs the server when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "logtoku_pg"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    res = subprocess.run(["useradd", "--system", "--no-create-home", "logtoku_pg"], capture_output=True, text=True, check=False)
    try:
        pwd.getpwnam("logtoku_pg")
    except KeyError:
        msg = f"running as root, and could not create an unprivileged account for initdb: useradd said {res.stderr.strip()!r}"
        raise ServerUnavailable(msg) from None
    return "logtoku_pg"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """A running throwaway server; :meth:`new_database` gives each test its own database."""

    folder: Path
    bindir: Path
    port: int
    account: str | None
    _count: int = field(default=0)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A new, empty database; returns its SQLAlchemy URL."""
        import psycopg

        self._count += 1
        name = f"t{self._count}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" STRATEGY FILE_COPY')  # type: ignore[arg-type]
        return self.url(name)

    def stop(self) -> None:
        _run(self, "pg_ctl", "stop", "-D", str(self.folder / "data"), "-m", "immediate", "-w", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


def _run(server: PostgresServer, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [str(server.bindir / tool), *args]
    if server.account is not None:
        cmd = ["runuser", "-u", server.account, "--", *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120, cwd=server.folder)
    if check and res.returncode != 0:
        msg = f"{tool} failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()[-2000:]}"
        raise ServerUnavailable(msg)
    return res


def _memory_folder() -> str | None:
    """/dev/shm where it is a writable folder (Linux), else the default temporary folder.

    The server's data is throwaway (fsync is off): on the disk, removing a session's databases (each
    a copy of the template, hundreds of files) took 40 s of the test run's teardown; in memory, under 1 s.
    """
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def start_server() -> PostgresServer:
    """initdb + pg_ctl start in a new temporary folder; :class:`ServerUnavailable` if impossible."""
    try:
        import psycopg  # noqa: F401
    except ImportError as e:
        msg = f"psycopg is not installed ({e}); install the postgresql extra: pip install -e '.[postgresql]'"
        raise ServerUnavailable(msg) from e
    bindir = find_bindir()
    account = _server_account()
    folder = Path(tempfile.mkdtemp(prefix="logtoku-pg-", dir=_memory_folder()))
    if account is not None:
        shutil.chown(folder, user=account)
    server = PostgresServer(folder=folder, bindir=bindir, port=0, account=account)
    try:
        data = folder / "data"
        _run(server, "initdb", "-D", str(data), "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
        last = ""
        for _ in range(3):  # the free port may be taken between choosing it and the server binding it
            server.port = _free_port()
            options = (
                f"-p {server.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={folder} "
                "-c fsync=off -c full_page_writes=off -c synchronous_commit=off -c max_connections=100"
            )
            log = folder / "server.log"
            res = _run(server, "pg_ctl", "start", "-D", str(data), "-w", "-t", "60", "-l", str(log), "-o", options, check=False)
            if res.returncode == 0:
                return server
            last = (log.read_text(errors="replace") if log.exists() else res.stderr)[-2000:]
        msg = f"pg_ctl start failed three times; last server log: {last}"
        raise ServerUnavailable(msg)
    except BaseException:
        server.stop()
        raise


def start_or_skip() -> PostgresServer:
    """:func:`start_server`, or skip the test saying why; under CI (``$CI``), fail it instead."""
    try:
        return start_server()
    except (ServerUnavailable, OSError, subprocess.SubprocessError) as e:
        reason = f"no PostgreSQL server could be started: {e}"
        if in_ci():
            pytest.fail(f"{reason} (CI=true: the PostgreSQL tests must run there, not skip)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the session: skipped if impossible, an error under CI."""
    server = start_or_skip()
    try:
        yield server
    finally:
        server.stop()
