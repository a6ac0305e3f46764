"""Reading a user's input file, bounded: a regular file only, and at most so many bytes.

Every file a command reads on a user's word (a policy, a labels file, a context file) goes
through :func:`read_bounded`: a named pipe would block the read forever (``ask --policy FIFO``
hung past 90 s), a device would be read without end (``calibrate --labels /dev/zero`` grew to
21 GB), so both are refused before anything is read, with a
:class:`~logtoku_guard.errors.ConfigurationError` naming the file, what it is and the limit.
The file is opened without blocking (a FIFO swapped in after the check cannot hang the read)
and read up to the limit plus one byte, so a file that grows meanwhile is refused too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from logtoku_guard.errors import ConfigurationError

__all__ = ["read_bounded", "read_bounded_text"]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bounded(path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``); ``what`` names it in errors ("the labels file")."""
    p = Path(path)
    shown = f"{what} {str(p)!r}"
    try:
        st = p.stat()
    except OSError as exc:
        msg = f"cannot read {shown}: {exc.strerror or exc}; check the path"
        raise ConfigurationError(msg) from exc
    if not stat.S_ISREG(st.st_mode):
        msg = f"{shown} is {_kind(st.st_mode)}, not a file; give a regular file"
        raise ConfigurationError(msg)
    if st.st_size > limit:
        msg = f"{shown} is {st.st_size} bytes, over the {limit}-byte limit; is it the right file?"
        raise ConfigurationError(msg)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        msg = f"cannot read {shown}: {exc.strerror or exc}; check its permissions"
        raise ConfigurationError(msg) from exc
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # replaced since the check
            msg = f"{shown} is not a regular file; give a regular file"
            raise ConfigurationError(msg)
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        msg = f"{shown} is over the {limit}-byte limit; is it the right file?"
        raise ConfigurationError(msg)
    return raw


def read_bounded_text(path: str | os.PathLike[str], limit: int, what: str) -> str:
    """:func:`read_bounded`, decoded as UTF-8 (the first bad byte and its offset named)."""
    raw = read_bounded(path, limit, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = (
            f"{what} {str(path)!r} is not valid UTF-8: byte {raw[exc.start : exc.start + 1]!r} at offset {exc.start} "
            f"({exc.reason}); save the file as UTF-8"
        )
        raise ConfigurationError(msg) from exc
