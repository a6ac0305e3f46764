"""The audit store's suite of tests/audit/test_audit.py, on a real PostgreSQL server (psycopg 3).

The server is a throwaway one started for the session (:mod:`support.postgres`: initdb + pg_ctl
in a temporary folder, a free port of 127.0.0.1); every test gets new, empty databases through
the ``store_url`` fixture, which overrides test_audit.py's SQLite files. The tests are skipped
only when no server can be started here; with ``CI=true`` that is an error instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.postgres import PostgresServer, postgres_server

# The shared suite: every test of test_audit.py that is not about SQLite's own files.
from test_audit import (
    StoreUrl,
    in_threads,
    rec,
    store,
    test_a_store_of_another_schema_version_is_refused_untouched,
    test_a_store_without_the_os_user_columns_gets_them,
    test_claims_expire_after_claim_ttl,
    test_export_io_errors_name_the_path_and_leave_nothing,
    test_export_jsonl_and_csv_parse_back,
    test_export_on_a_full_disk_leaves_no_file,
    test_export_refuses_an_existing_file_unless_overwrite,
    test_from_result_builds_the_record_and_round_trips,
    test_processes_creating_one_new_store_at_once_all_succeed,
    test_purge_days_must_be_finite_non_negative_and_in_range,
    test_purge_keeps_undecided_items_unless_asked_and_dry_run_deletes_nothing,
    test_purge_removes_old_records_and_their_decided_review_items,
    test_record_for_review_is_one_transaction,
    test_redact_answer_is_opt_in_and_drops_token_texts,
    test_redaction_keeps_the_raw_prompt_out_of_the_database,
    test_release_by_the_claimer_or_with_force,
    test_review_errors,
    test_review_life_cycle,
    test_round_trip_keeps_every_field_and_stores_nan_as_null,
    test_tail_is_newest_first_and_count,
    test_threads_and_processes_writing_one_file,
    test_threads_opening_one_new_store_at_once_all_succeed,
    test_two_reviewers_racing_to_approve_exactly_one_wins,
    test_unknown_and_duplicate_trace_ids,
    test_writer_killed_mid_run_leaves_a_clean_store,
)

from logtoku_guard.audit import AuditStore
from logtoku_guard.errors import AuditStoreError

__all__ = [  # collected here too, against PostgreSQL
    "postgres_server",
    "store",
    "test_a_store_of_another_schema_version_is_refused_untouched",
    "test_a_store_without_the_os_user_columns_gets_them",
    "test_claims_expire_after_claim_ttl",
    "test_export_io_errors_name_the_path_and_leave_nothing",
    "test_export_jsonl_and_csv_parse_back",
    "test_export_on_a_full_disk_leaves_no_file",
    "test_export_refuses_an_existing_file_unless_overwrite",
    "test_from_result_builds_the_record_and_round_trips",
    "test_processes_creating_one_new_store_at_once_all_succeed",
    "test_purge_days_must_be_finite_non_negative_and_in_range",
    "test_purge_keeps_undecided_items_unless_asked_and_dry_run_deletes_nothing",
    "test_purge_removes_old_records_and_their_decided_review_items",
    "test_record_for_review_is_one_transaction",
    "test_redact_answer_is_opt_in_and_drops_token_texts",
    "test_redaction_keeps_the_raw_prompt_out_of_the_database",
    "test_release_by_the_claimer_or_with_force",
    "test_review_errors",
    "test_review_life_cycle",
    "test_round_trip_keeps_every_field_and_stores_nan_as_null",
    "test_tail_is_newest_first_and_count",
    "test_threads_and_processes_writing_one_file",
    "test_threads_opening_one_new_store_at_once_all_succeed",
    "test_two_reviewers_racing_to_approve_exactly_one_wins",
    "test_unknown_and_duplicate_trace_ids",
    "test_writer_killed_mid_run_leaves_a_clean_store",
]


@pytest.fixture
def store_url(postgres_server: PostgresServer) -> StoreUrl:
    """A new database on the session's server per store name of the test."""
    urls: dict[str, str] = {}

    def url(name: str = "audit") -> str:
        if name not in urls:
            urls[name] = postgres_server.new_database()
        return urls[name]

    return url


# ----------------------------------------------------------------------------- PostgreSQL only


def test_the_tables_use_postgresql_types(store: AuditStore) -> None:
    assert store.engine.dialect.name == "postgresql" and store.engine.dialect.driver == "psycopg"
    types = {c["name"]: type(c["type"]).__name__ for c in sa.inspect(store.engine).get_columns("audit_records")}
    assert types["tokens"] == types["stats"] == types["timings"] == "JSONB"
    assert types["created_at"] == "TIMESTAMP" and types["reliability"] == "DOUBLE_PRECISION"
    trace = store.record(rec(stats={"nested": {"a": [1, 2.5, None]}}))
    with store.engine.connect() as conn:
        query = "SELECT stats -> 'nested' -> 'a' ->> 1 FROM audit_records WHERE trace_id = %(t)s"
        got = conn.exec_driver_sql(query, {"t": trace})
        assert got.scalar() == "2.5"  # queryable JSON, not text


def test_url_repr_hides_the_password_and_a_wrong_server_is_a_clear_error(postgres_server: PostgresServer) -> None:
    url = postgres_server.url("postgres").replace("logtoku@", "logtoku:s3cret@")
    with AuditStore(url) as s:
        assert "s3cret" not in repr(s) and "s3cret" not in s.url and "***" in s.url
    closed_port = postgres_server.url("postgres").replace(f":{postgres_server.port}/", ":1/")
    expected = r"(?s)could not open the audit store at .*:1/postgres.*server is reachable"
    with pytest.raises(AuditStoreError, match=expected):
        AuditStore(closed_port)


def test_nul_characters_are_refused_with_the_reason(store: AuditStore) -> None:
    # PostgreSQL text cannot hold NUL; SQLite can. The error says so instead of blaming the network.
    with pytest.raises(AuditStoreError, match="cannot store NUL characters"):
        store.record(rec(prompt="a\x00b"))
    with pytest.raises(AuditStoreError, match="cannot store NUL characters"):
        store.record(rec(tokens=[{"token": "\x00", "au": 0.1}]))
    assert store.count() == 0


def test_export_has_no_store_files_to_protect(store: AuditStore, tmp_path: Path) -> None:
    store.record(rec())
    # a SQLite store refuses these names when they are its own files; a server's store has none
    assert store.export(tmp_path / "audit.db") == 1
    assert json.loads((tmp_path / "audit.db").read_text())["prompt"] == "What is the capital of France?"


def test_no_server_is_a_skip_with_the_reason_and_an_error_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    from support import postgres

    def no_server() -> PostgresServer:
        raise postgres.ServerUnavailable("no initdb/pg_ctl found")

    monkeypatch.setattr(postgres, "start_server", no_server)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL server could be started: no initdb/pg_ctl found"):
        postgres.start_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"no initdb/pg_ctl found \(CI=true: .* must run there, not skip\)"):
        postgres.start_or_skip()


def test_a_server_side_disconnect_costs_no_failed_write(store: AuditStore, postgres_server: PostgresServer) -> None:
    # A server restart or an idle timeout closes pooled connections; the next use must not fail.
    store.record(rec(prompt="before"))
    with sa.create_engine(postgres_server.url("postgres")).connect() as admin:
        killed = admin.exec_driver_sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %(db)s AND pid <> pg_backend_pid()",
            {"db": store.engine.url.database},
        ).scalar()
    assert killed and killed >= 1  # the store's pooled connection was there, and is gone
    store.record(rec(prompt="after"))
    assert store.count() == 2


def test_reviewer_registries_opened_at_once_on_a_new_database_all_succeed(postgres_server: PostgresServer) -> None:
    import threading

    from logtoku_guard.audit.reviewers import ReviewerRegistry

    for _ in range(3):  # a race needs a few tries to show; each round a new database
        url = postgres_server.new_database()
        with AuditStore(url):
            pass  # the audit tables exist; the reviewers table does not yet
        barrier = threading.Barrier(6)

        def open_registry(k: int, url: str = url, barrier: threading.Barrier = barrier) -> None:
            with AuditStore(url) as s:
                barrier.wait()
                ReviewerRegistry(s).add(f"reviewer{k}")

        assert in_threads(open_registry, 6) == [None] * 6


def test_an_id_past_the_columns_range_is_no_item_not_an_unreachable_store(store: AuditStore) -> None:
    """F7: PostgreSQL refuses 2147483648 for an integer column; the store must say "no such item"."""
    from logtoku_guard.errors import UnknownReviewItemError

    for item_id in (2**31, 2**63 - 1, 0, -5):
        with pytest.raises(UnknownReviewItemError, match=f"no review item with id {item_id}"):
            store.review_item(item_id)
        with pytest.raises(UnknownReviewItemError):
            store.claim(item_id, "alice")
        with pytest.raises(UnknownReviewItemError):
            store.approve(item_id, "alice")


def test_a_nul_in_a_note_or_an_edit_is_refused_as_bad_input(store: AuditStore) -> None:
    """F7: a NUL byte in a reviewer's note or edited answer is a ConfigurationError (the page's 400), not "unreachable"."""
    from logtoku_guard.audit import AuditRecord
    from logtoku_guard.errors import ConfigurationError

    rec = AuditRecord(
        model="m", policy_name="p", policy_version="1", prompt="q", answer="a", action="human_review",
        reason="r", rule=None, reliability=None, tokens=[], stats={},
    )  # fmt: skip
    item = store.record_for_review(rec)
    with pytest.raises(ConfigurationError, match="NUL"):
        store.approve(item.id, "alice", edited_answer="fine\x00not")
    with pytest.raises(ConfigurationError, match="NUL"):
        store.reject(item.id, "alice", note="why\x00")
    assert store.review_item(item.id).status == "pending"  # nothing was changed
