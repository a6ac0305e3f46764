"""``GET /v1/logtoku/reviews/{id}`` on a stored row that cannot be read (issue 43, N8), through the real server.

The row is damaged, the store is fine: the answer is a 422 with ``code: "unreadable_row"`` naming the
row and the column (not a 503 inviting a retry, never a 500), without the value the row holds (it
may be the withheld draft); every other item still answers.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from logtoku_guard.audit import AuditStore  # noqa: E402
from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 3, "temperature": 0}
MARK = "DRAFTMARK"


def always_review() -> Policy:
    rule = {"name": "always", "when": {"stat": "reliability", "op": ">", "value": -1e9}, "action": "human_review"}
    return Policy.from_dict({"name": "review-all", "rules": [rule]})


@pytest.mark.parametrize(
    ("table", "column", "literal"),
    [
        ("review_items", "created_at", f"'{MARK}'"),
        ("audit_records", "answer", "CAST(x'" + MARK.encode().hex() + "ff' AS TEXT)"),  # not UTF-8: not text
    ],
    ids=["timestamp", "draft-bytes"],
)
def test_an_unreadable_row_is_a_422_naming_it_without_its_value(
    table: str, column: str, literal: str, tiny_backend: Any, tmp_path: Path
) -> None:
    db = tmp_path / "audit.db"
    with AuditStore(db) as store, BackgroundServer(build_app(tiny_backend, policy=always_review(), store=store)) as srv:
        ids = []
        for _ in range(2):
            r = httpx.post(f"{srv.base_url}/chat/completions", json=CHAT, timeout=120)
            assert r.status_code == 200, r.text
            ids.append(r.json()["choices"][0]["logtoku_guard"]["review_id"])
        bad, good = ids
        raw = sqlite3.connect(db, isolation_level=None)
        try:
            query = "SELECT id FROM audit_records WHERE review_id = ?"
            row = bad if table == "review_items" else raw.execute(query, (bad,)).fetchone()[0]
            raw.execute(f"UPDATE {table} SET {column} = {literal} WHERE id = ?", (row,))
        finally:
            raw.close()
        for wait in (0, 0.2):
            r = httpx.get(f"{srv.base_url}/logtoku/reviews/{bad}", params={"wait": wait}, timeout=60)
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert (err["type"], err["code"]) == ("unreadable_row", "unreadable_row"), err
            assert f"review item {bad} cannot be read" in err["message"] and f"{table} row {row}" in err["message"], err
            assert column in err["message"] and "fix or delete" in err["message"], err
            assert MARK not in r.text  # the stored value itself is never sent
        other = httpx.get(f"{srv.base_url}/logtoku/reviews/{good}", timeout=60)
        assert other.status_code == 200 and other.json()["status"] == "pending", other.text
