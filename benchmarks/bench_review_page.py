"""Time of one page of the review queue (``logtoku-guard review serve``) over 10 000 queued items.

Fills a temporary SQLite store with ``--n`` records queued for review (48 tokens each, in one
transaction), then times full HTTP requests through the app (routing, session, query, Jinja2
rendering) with Starlette's TestClient: the first, a middle and the last page of the pending
queue, a page filtered by rule and model, and the decided tab. Target: under 200 ms a page.

Run: .venv/bin/python benchmarks/bench_review_page.py [--n 10000] [--per-page 50] [--repeat 20]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from starlette.testclient import TestClient

from logtoku_guard.audit import AuditRecord, AuditStore
from logtoku_guard.review_web import create_app

TOKEN = "benchmark-admin-token-0123456789"


def make_record(i: int, rng: random.Random) -> AuditRecord:
    tokens = [
        {"index": j, "token": f" w{j}", "au": rng.random(), "eu": rng.random(), "quadrant": rng.choice(["I", "II", "III", "IV"]),
         "logprob": -rng.random(), "top_logits": [rng.uniform(5, 20), rng.uniform(0, 5)]}
        for j in range(48)
    ]  # fmt: skip
    return AuditRecord(
        model=rng.choice(["SmolLM2-135M-Instruct", "Qwen2.5-0.5B-Instruct"]),
        policy_name="default",
        policy_version="1",
        prompt=f"Question number {i}: who founded the Zarnovian Institute of Quantum Botany?",
        answer="".join(t["token"] for t in tokens),
        action="human_review",
        reason="reliability -0.31 < threshold -0.20",
        rule=rng.choice(["low_reliability", "high_eu_share", "max_eu"]),
        reliability=-rng.random(),
        tokens=tokens,
        stats={"reliability": -0.31, "max_eu": 0.97},
    )


def fill(store: AuditStore, n: int) -> None:
    """Queue ``n`` records in one write transaction (the store's own insert and enqueue steps)."""
    rng = random.Random(0)
    with store._transaction("fill", write=True) as conn:
        for i in range(n):
            rec = make_record(i, rng)
            store._insert_record(conn, rec)
            store._enqueue(conn, rec.trace_id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--per-page", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, AuditStore(Path(tmp) / "audit.db") as store:
        start = time.perf_counter()
        fill(store, args.n)
        ids = [i.id for i in store.pending(limit=200)]
        for k in ids[:100]:
            store.approve(k, "bench")
        print(f"filled {args.n} queued items in {time.perf_counter() - start:.1f} s (100 of them decided)")
        client = TestClient(create_app(store, TOKEN), base_url="http://127.0.0.1")
        client.get(f"/?token={TOKEN}")
        last = -(-(args.n - 100) // args.per_page)
        pages = {
            "pending, page 1": f"/?per_page={args.per_page}",
            "pending, middle page": f"/?per_page={args.per_page}&page={last // 2}",
            "pending, last page": f"/?per_page={args.per_page}&page={last}",
            "pending, rule + model filter": f"/?per_page={args.per_page}&rule=max_eu&model=SmolLM2-135M-Instruct&page=5",
            "decided, page 1": f"/?view=decided&per_page={args.per_page}",
            "one item page": f"/items/{ids[150]}",
        }
        print(f"Python {sys.version.split()[0]}, {platform.platform()}; {args.per_page} rows a page, {args.repeat} requests each")
        worst = 0.0
        for name, path in pages.items():
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r = client.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    raise SystemExit(f"{path}: HTTP {r.status_code}")
            worst = max(worst, statistics.median(times))
            print(f"  {name:32s} median {statistics.median(times):6.1f} ms   max {max(times):6.1f} ms")
        verdict = "under" if worst < 200 else "OVER"
        print(f"slowest median page: {worst:.1f} ms ({verdict} the 200 ms target) over {args.n} items")


if __name__ == "__main__":
    main()
