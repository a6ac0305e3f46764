"""The server on a PostgreSQL audit store: NUL is refused before generation, and a database error is a
503 that does not name the database (issue 43, N10), against the real throwaway server of
:mod:`support.postgres` (skipped only where none can be started; an error under CI).

The reproducer: a question holding ``\\u0000`` was generated, then answered with a 500 naming the
database's host, port, user and name ("PostgreSQL text fields cannot contain NUL"); with the
database gone, chat answered 500 with the connection target.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.postgres import SUPERUSER, PostgresServer, postgres_server

pytest.importorskip("fastapi")
pytest.importorskip("psycopg")
httpx = pytest.importorskip("httpx")

from logtoku_guard.audit import AuditStore  # noqa: E402
from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402

__all__ = ["postgres_server"]


def warn_always() -> Policy:
    rule = {"name": "always", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": "warn"}
    return Policy.from_dict({"name": "always-warn", "rules": [rule]})


def chat(content: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0}


def test_nul_is_refused_before_generation(postgres_server: PostgresServer, tiny_backend: Any) -> None:
    url = postgres_server.new_database()
    with AuditStore(url) as store, BackgroundServer(build_app(tiny_backend, policy=warn_always(), store=store)) as srv:
        ok = httpx.post(f"{srv.base_url}/chat/completions", json=chat("Paris"), timeout=60)
        assert ok.status_code == 200, ok.text
        before = store.count()
        r = httpx.post(f"{srv.base_url}/chat/completions", json=chat("Par\u0000is"), timeout=60)
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "U+0000" in message and "PostgreSQL" in message
        assert store.count() == before  # nothing generated, nothing recorded
        # a literal backslash-u0000 is ordinary text
        assert httpx.post(f"{srv.base_url}/chat/completions", json=chat("a \\u0000 b"), timeout=60).status_code == 200


def test_a_database_error_is_a_503_without_its_address(
    postgres_server: PostgresServer, tiny_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import psycopg

    url = postgres_server.new_database()
    name = url.rsplit("/", 1)[1]
    caplog.set_level(logging.ERROR)
    with AuditStore(url) as store, BackgroundServer(build_app(tiny_backend, policy=warn_always(), store=store)) as srv:
        assert httpx.post(f"{srv.base_url}/chat/completions", json=chat("Paris"), timeout=60).status_code == 200
        admin = {"host": "127.0.0.1", "port": postgres_server.port, "user": SUPERUSER, "dbname": "postgres"}
        with psycopg.connect(**admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        r = httpx.post(f"{srv.base_url}/chat/completions", json=chat("Paris"), timeout=60)
        review = httpx.get(f"{srv.base_url}/logtoku/reviews/1", timeout=60)
    for response in (r, review):
        assert response.status_code == 503, response.text
        for secret in (name, str(postgres_server.port), "127.0.0.1", "postgresql"):
            assert secret not in response.text, response.text
    assert any(name in rec.getMessage() for rec in caplog.records)  # the address goes to the log
