"""The files of a SQLite audit store: owner-only creation, the check that a file is a store, exports.

* A new store file is built complete under a temporary name (mode 0600) and linked into place,
  so the path either does not exist or holds a whole store; SQLite gives the ``-wal``/``-shm``
  files the database file's mode. An existing file's mode is left as it is.
* An existing file must be a SQLite database (never an empty or foreign file silently turned
  into a new store); the store then checks that it holds our tables.
* An export is written to a temporary file in the target's folder and renamed into place:
  a failed export leaves nothing behind, and the store's own files are refused.
"""

from __future__ import annotations

import os
import stat
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

import sqlalchemy as sa

from logtoku_guard.errors import AuditStoreError, ConfigurationError

_SQLITE_HEADER = b"SQLite format 3\x00"
STORE_SUFFIXES = ("", "-wal", "-shm", "-journal")
"""The files of a SQLite database at a path: the database, its WAL, shared memory and rollback journal."""


def sqlite_file(url: sa.URL) -> Path | None:
    """The file of a SQLite URL, or None (another backend, or a ``file:`` URI left to SQLite)."""
    db = url.database
    if url.get_backend_name() != "sqlite" or not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db)


def check_store_name(path: Path) -> None:
    """Refuse a path named like a SQLite side file (``x.db-wal``, ``-shm``, ``-journal``).

    SQLite treats ``<db>-wal`` as the write-ahead log of ``<db>``: a store kept there would be
    replayed into, or deleted by, whoever opens ``<db>``.
    """
    for suffix in STORE_SUFFIXES[1:]:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            base = path.with_name(path.name[: -len(suffix)])
            msg = (
                f"cannot keep an audit store at {path}: SQLite uses that name for the {suffix[1:]} file of {base}, "
                f"and deletes or rewrites it whenever {base} is opened; pass a name that does not end in "
                f"{', '.join(STORE_SUFFIXES[1:])}, e.g. {path.with_name(path.name[: -len(suffix)] + '.audit.db')}"
            )
            raise ConfigurationError(msg)


def read_only_url(path: Path) -> sa.URL | None:
    """A read-only SQLite URL for the existing store file ``path`` if this process may not write
    it or its folder; None if it may (or if ``path`` is not a regular file: the caller says why).

    SQLite keeps a WAL database's shared index in ``<db>-shm`` beside it, which a reader must be
    able to create or find: in a folder the process cannot write and with no ``-shm`` file (no
    writer has the store open) the file is opened ``immutable`` (read as it is on disk, without
    locks); otherwise ``mode=ro``, which reads the writer's ``-wal`` as well.
    """
    try:
        if not path.is_file():
            return None
    except OSError:
        return None
    folder = path.parent
    folder_writable = os.access(folder, os.W_OK | os.X_OK)
    if os.access(path, os.W_OK) and folder_writable:
        return None
    query = {"mode": "ro", "uri": "true"}
    if not folder_writable and not any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-shm")):
        query["immutable"] = "1"
    return sa.URL.create("sqlite", database="file:" + urllib.parse.quote(str(path), safe="/"), query=query)


def check_existing(path: Path, fix: str) -> bool:
    """True if ``path`` exists and looks like a SQLite database; False if it does not exist.

    Raises :class:`AuditStoreError` for a folder, a pipe or device, an empty file or a file that
    is not SQLite (nothing is read from anything but a regular file: a pipe would block).
    """
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        msg = f"could not open the audit store at {path}: {e.strerror or e}; {fix}"
        raise AuditStoreError(msg) from e
    size = st.st_size
    if stat.S_ISDIR(st.st_mode):
        msg = f"could not open the audit store at {path}: it is a folder; pass a file path inside it ({path / 'audit.db'}); {fix}"
        raise AuditStoreError(msg)
    if not stat.S_ISREG(st.st_mode):
        kind = "a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        msg = f"{path} is {kind}, not a file, so it cannot hold an audit store; pass the path of a regular file"
        raise AuditStoreError(msg)
    if size == 0:
        msg = (
            f"the audit store file {path} is empty (0 bytes), so it is not an audit store (truncated?); "
            "restore it from a backup, or remove it (or pass another path) to start a new store"
        )
        raise AuditStoreError(msg)
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except OSError as e:
        msg = f"could not read the audit store at {path}: {e.strerror or e}; {fix}"
        raise AuditStoreError(msg) from e
    if head != _SQLITE_HEADER:
        msg = (
            f"{path} is not an audit store (not a SQLite database: it starts with {head[:16]!r}); "
            "pass the path of an audit store, or a new path to start one"
        )
        raise AuditStoreError(msg)
    return True


def create_store_file(path: Path, init: Callable[[Path], None], fix: str) -> None:
    """Create the store at ``path`` (owner-only) unless another process just did.

    ``init(tmp)`` builds the tables in a temporary file of the same folder; the finished file is
    hard-linked to ``path`` (atomic, never replacing an existing file).
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.creating")
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as e:
        msg = f"could not create the audit store at {path}: {e.strerror or e}; {fix}"
        raise AuditStoreError(msg) from e
    try:
        init(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created the store first: use theirs
        except OSError:  # no hard links on this file system: a rename, unless the store appeared meanwhile
            if not path.exists():
                os.replace(tmp, path)
    except OSError as e:
        msg = f"could not create the audit store at {path}: {e.strerror or e}; {fix}"
        raise AuditStoreError(msg) from e
    finally:
        for suffix in STORE_SUFFIXES:
            Path(f"{tmp}{suffix}").unlink(missing_ok=True)


def _open_text(fd: int) -> IO[str]:
    """The temporary export file as text (a seam for tests that simulate a full disk)."""
    return os.fdopen(fd, "w", encoding="utf-8", newline="")


def export_to(path: str | os.PathLike[str], store_file: Path | None, overwrite: bool, write: Callable[[IO[str]], int]) -> int:
    """Run ``write`` on a temporary file next to ``path``, then move it to ``path``; returns its count.

    Refuses the store's own files and, unless ``overwrite``, an existing ``path``. On any failure
    the temporary file is removed and ``path`` is left as it was.
    """
    target = Path(path).expanduser().absolute()
    if store_file is not None:
        real = target.resolve()
        base = str(store_file.resolve())
        if any(real == Path(base + suffix) for suffix in STORE_SUFFIXES):
            msg = (
                f"refusing to export onto {target}: it is a file of the audit store itself ({store_file}), "
                f"which the export would destroy; pass another path, e.g. {store_file.with_suffix('.jsonl')}"
            )
            raise ConfigurationError(msg)
    if target.is_dir():
        msg = f"cannot export to {target}: it is a folder; pass a file path, e.g. {target / 'audit.jsonl'}"
        raise ConfigurationError(msg)
    if not overwrite and (target.exists() or target.is_symlink()):
        msg = f"cannot export to {target}: the file exists; pass another path, or overwrite=True (CLI: --force) to replace it"
        raise ConfigurationError(msg)
    folder = target.parent
    if not folder.is_dir():
        msg = f"cannot export to {target}: the folder {folder} does not exist; create it, or pass a path in an existing folder"
        raise AuditStoreError(msg)
    fix = f"check that this user can write to {folder} and that the disk has space; nothing was written to {target}"
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        msg = f"cannot export to {target}: {e.strerror or e}; {fix}"
        raise AuditStoreError(msg) from e
    try:
        with _open_text(fd) as f:
            n = write(f)
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                msg = (
                    f"cannot export to {target}: the file appeared during the export; "
                    "pass another path, or overwrite=True (CLI: --force)"
                )
                raise ConfigurationError(msg) from None
            except OSError:  # no hard links here
                os.replace(tmp, target)
    except OSError as e:
        msg = f"could not export to {target}: {e.strerror or e}; {fix}"
        raise AuditStoreError(msg) from e
    finally:
        Path(tmp).unlink(missing_ok=True)
    return n
