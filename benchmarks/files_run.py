"""The distinct source files a call runs through, by package: what ``bench_entry_points.py`` and
``bench_langchain_invoke.py`` count.

A file counts when one of its functions is called (``sys.setprofile``; with ``threads``, also
``threading.setprofile``, for the threads started after :meth:`FilesRun.install`) while
:meth:`FilesRun.recording` is open. A module body (an import) is not a call of the code measured.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PACKAGES = ("logtoku_guard", "langchain_logtoku", "langchain_core")


class FilesRun:
    """Records the source files whose functions run inside :meth:`recording`."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self._on = threading.Event()

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if self._on.is_set() and event == "call" and frame.f_code.co_name != "<module>":
            self.files.add(frame.f_code.co_filename)

    def install(self, *, threads: bool = False) -> None:
        """Profile this thread, and with ``threads`` every thread started from now on."""
        if threads:
            threading.setprofile(self._profile)
        sys.setprofile(self._profile)

    def uninstall(self) -> None:
        threading.setprofile(None)
        sys.setprofile(None)

    @contextmanager
    def recording(self) -> Iterator[None]:
        """The files of the calls made inside (those recorded before are forgotten)."""
        self.files.clear()
        self._on.set()
        try:
            yield
        finally:
            self._on.clear()

    def by_package(self) -> Counter[str]:
        """How many of the recorded files belong to each of :data:`PACKAGES`."""
        counts: Counter[str] = Counter()
        for f in self.files:
            parts = Path(f).parts
            for package in PACKAGES:
                if package in parts:
                    counts[package] += 1
                    break
        return counts
