"""Throughput of the audit store on a temporary SQLite file.

Measures: records written per second from one thread and from 4 threads (each record its own
transaction, WAL, synchronous=NORMAL), queueing every record for review, then the time of
``pending()`` (all items open) and of ``export`` to JSONL and CSV for that many records.

Run: .venv/bin/python benchmarks/bench_audit.py [--n 2000] [--tokens 48] [--threads 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

import sqlalchemy

from logtoku_guard.audit import AuditRecord, AuditStore, ExportFormat


def make_record(i: int, n_tokens: int, rng: random.Random) -> AuditRecord:
    """A record shaped like a guarded answer: ``n_tokens`` token payloads with K=2 top logits."""
    tokens = [
        {
            "index": j,
            "token": f"tok{j}",
            "id": rng.randrange(50_000),
            "au": rng.random(),
            "eu": rng.random(),
            "quadrant": None,
            "logprob": -rng.random() * 3,
            "entropy": rng.random(),
            "top_logits": [rng.uniform(5, 20), rng.uniform(0, 5)],
        }
        for j in range(n_tokens)
    ]
    return AuditRecord(
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        policy_name="default",
        policy_version="1.0",
        prompt=f"Question number {i}: who founded the Zarnovian Institute of Quantum Botany?",
        answer="I don't know. " * 8,
        action="review",
        reason="reliability -0.31 < threshold -0.20",
        rule="low_reliability",
        reliability=-0.31,
        attempts=1,
        tokens=tokens,
        stats={"reliability": -0.31, "reliability_mean": -0.12, "max_eu": 0.97, "n_tokens": float(n_tokens)},
        timings={"total_s": 0.85, "generation_s": 0.84, "decision_s": 0.002, "retrieval_s": 0.0},
    )


def write(store: AuditStore, records: list[AuditRecord], threads: int) -> float:
    """Record every record, split over ``threads`` threads; returns the wall time in seconds."""
    chunks = [records[k::threads] for k in range(threads)]
    errors: list[BaseException] = []

    def run(chunk: list[AuditRecord]) -> None:
        try:
            for rec in chunk:
                store.record(rec)
        except BaseException as e:  # re-raised in the main thread below
            errors.append(e)

    workers = [threading.Thread(target=run, args=(chunk,)) for chunk in chunks]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="records per measurement (default 2000)")
    parser.add_argument("--tokens", type=int, default=48, help="token dicts per record (default 48)")
    parser.add_argument("--threads", type=int, default=4, help="writer threads of the concurrent run (default 4)")
    args = parser.parse_args()
    if args.n < 1 or args.tokens < 0 or args.threads < 1:
        parser.error("--n and --threads must be >= 1, --tokens >= 0")

    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"machine: {platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, SQLAlchemy {sqlalchemy.__version__}"
    )
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="bench_audit_") as tmp:
        print(f"store: SQLite files in {tmp} ({args.n} records of {args.tokens} tokens each)")
        one = [make_record(i, args.tokens, rng) for i in range(args.n)]
        many = [make_record(i, args.tokens, rng) for i in range(args.n)]
        with AuditStore(Path(tmp) / "single.db") as store, AuditStore(Path(tmp) / "threads.db") as store_mt:
            t = write(store, one, threads=1)
            print(f"record(), 1 thread:      {args.n / t:9.0f} records/s  ({t:.2f} s)")
            t = write(store_mt, many, threads=args.threads)
            print(f"record(), {args.threads} threads:     {args.n / t:9.0f} records/s  ({t:.2f} s)")

            start = time.perf_counter()
            for rec in one:
                store.enqueue(rec.trace_id)
            t = time.perf_counter() - start
            print(f"enqueue(), 1 thread:     {args.n / t:9.0f} items/s    ({t:.2f} s)")

            start = time.perf_counter()
            items = store.pending()
            t = time.perf_counter() - start
            print(f"pending() of {len(items)} items:   {t * 1000:9.1f} ms")
            formats: tuple[ExportFormat, ...] = ("jsonl", "csv")
            for fmt in formats:
                out = Path(tmp) / f"export.{fmt}"
                start = time.perf_counter()
                rows = store.export(out, fmt=fmt)
                t = time.perf_counter() - start
                size = out.stat().st_size / 1e6
                print(f"export({fmt!r}) of {rows} rows: {t * 1000:9.1f} ms  ({size:.1f} MB)")


if __name__ == "__main__":
    main()
