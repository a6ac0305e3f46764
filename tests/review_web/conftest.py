from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from logtoku_guard.audit import AuditStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.db") as s:
        yield s
