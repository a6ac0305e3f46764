"""Peak memory and CPU time of a refit on reviewers' verdicts (``calibrate --labels-from-store``) against
the size of the audit store.

Builds a synthetic SQLite store of ``--n`` decided review items (each record with ``--tokens`` token
payloads, like a guarded answer; about a third rejected or edited), then, in a fresh child process
each (so the peaks do not mix):

* ``stream``: what the command runs now: :func:`~logtoku_guard.calibration.review_labels.read_label_matrix`
  (the verdicts streamed in batches, only the statistics kept) and
  :func:`~logtoku_guard.calibration.review_labels.refit_on_reviews` against the shipped guard;
* ``whole`` (only with ``--whole``; slow and large on a big store): the path before issue 43,
  every decided item read whole (``ReviewQueue.decided()``, tokens included) before the same refit.

Each line: the mode, N, the child's peak RSS (``ru_maxrss``) and its CPU time (user + system).
The store is built once per N and kept in ``--dir`` (default: a temporary folder) when given.

Run: .venv/bin/python benchmarks/bench_refit_memory.py --n 100000 [--n 10000 ...] [--tokens 48] [--whole]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

MODEL = "smollm2-135m-instruct"


def build(path: Path, n: int, n_tokens: int, seed: int = 0) -> float:
    """A store of ``n`` decided review items at ``path`` (bulk inserts, one transaction per 5000); seconds taken."""
    import sqlalchemy as sa

    from logtoku_guard.audit import AuditStore
    from logtoku_guard.audit.schema import _records, _reviews

    rng = random.Random(seed)
    start = time.perf_counter()
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    part = path.with_name(path.name + ".part")  # renamed when complete: an interrupted build is never measured
    with AuditStore(part) as store:
        for first in range(0, n, 5000):
            recs, items = [], []
            for i in range(first, min(n, first + 5000)):
                right = rng.random() < 0.65
                rel = rng.gauss(0.6 if right else -0.2, 0.5)
                stats = {
                    "reliability": rel,
                    "probability_reliability": rel + rng.gauss(0, 0.3),
                    "max_eu": min(1.0, max(0.0, rng.gauss(0.4 if right else 0.7, 0.2))),
                    "first_eu": rng.random(),
                    "word_mean_eu": rng.random(),
                    "max_au": rng.random() * 3,
                    "mean_au": rng.random(),
                    "prompt_max_eu": rng.random(),
                    "prompt_mean_eu": rng.random(),
                    "prompt_mean_logprob": -rng.random() * 4,
                    "prompt_min_logprob": -rng.random() * 12,
                    "n_tokens": float(n_tokens),
                    "guard_score": rng.random(),
                }
                tokens = [
                    {"index": j, "token": f" tok{j}", "id": rng.randrange(50_000), "au": rng.random(), "eu": rng.random(),
                     "quadrant": "I", "logprob": -rng.random() * 3, "entropy": rng.random(),
                     "top_logits": [rng.uniform(5, 20), rng.uniform(0, 5)]}
                    for j in range(n_tokens)
                ]  # fmt: skip
                trace = f"{i:032x}"
                when = t0 + timedelta(seconds=i)
                recs.append(
                    {
                        "trace_id": trace, "created_at": when, "model": MODEL, "policy_name": "default",
                        "policy_version": "1", "prompt": f"Question {i}: who founded the Institute of Botany?",
                        "answer": "I think it was founded by someone. " * 4, "action": "human_review",
                        "reason": "guard_score below the threshold", "rule": "low-guard-score", "reliability": rel,
                        "attempts": 1, "tokens": tokens, "stats": stats, "timings": {"total_s": 0.8}, "tool_calls": [],
                        "review_id": i + 1,
                    }
                )  # fmt: skip
                edited = right and rng.random() < 0.05
                items.append(
                    {
                        "id": i + 1, "trace_id": trace, "status": "approved" if right else "rejected",
                        "created_at": when, "claimed_by": "ann", "claimed_at": when, "reviewer": "ann",
                        "decided_at": when + timedelta(minutes=5), "edited_answer": "Fixed." if edited else None,
                        "note": None if right else "wrong",
                    }
                )  # fmt: skip
            with store.engine.begin() as conn:
                conn.execute(sa.insert(_records), recs)
                conn.execute(sa.insert(_reviews), items)
    part.rename(path)
    return time.perf_counter() - start


CHILD = r"""
import resource, sys, time, json
from logtoku_guard.audit import AuditStore
from logtoku_guard.calibration.guard_fit import shipped_guard
from logtoku_guard.calibration.review_labels import ReviewLabel, StoredStats, read_label_matrix, refit_on_reviews
mode, path, model = sys.argv[1], sys.argv[2], sys.argv[3]
current = shipped_guard(model)
store = AuditStore(path, create=False)
if mode == "stream":
    labels = read_label_matrix(store, model, features=current.features)
else:  # the path before issue 43: every decided item read whole, tokens included
    labels = [ReviewLabel(i.id, i.trace_id, StoredStats(dict(i.record.stats)), i.status == "approved" and i.edited_answer is None,
              i.decided_at) for i in store.decided() if i.record.model == model]
store.close()
refit = refit_on_reviews(current, labels)
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"peak_mib": u.ru_maxrss / 1024, "cpu_s": u.ru_utime + u.ru_stime, "n": len(labels),
                  "verdict": refit.verdict()}))
"""


def measure(mode: str, path: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), MODEL], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="decided review items in the store (repeatable)")
    parser.add_argument("--tokens", type=int, default=48, help="token payloads per record")
    parser.add_argument("--whole", action="store_true", help="also measure the old read-everything path")
    parser.add_argument("--dir", type=Path, default=None, help="keep the stores here (default: a temporary folder)")
    args = parser.parse_args()
    sizes = args.n or [10_000]
    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"# bench_refit_memory.py {' '.join(sys.argv[1:])}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            path = folder / f"refit-{n}-{args.tokens}.db"
            if not path.exists():
                secs = build(path, n, args.tokens)
                print(
                    f"built {n} decided items ({args.tokens} tokens each): {path.stat().st_size / 2**20:.0f} MiB in {secs:.0f} s"
                )
            for mode in ("stream", "whole") if args.whole else ("stream",):
                r = measure(mode, path)
                print(f"{mode:6s} n={n:>7d}: peak RSS {r['peak_mib']:7.0f} MiB, CPU {r['cpu_s']:6.1f} s  ({r['verdict']})")


if __name__ == "__main__":
    main()
