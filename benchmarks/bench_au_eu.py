"""Cost of the one AU/EU implementation per decoding step: ``token_logtoku`` on one step's rows.

Run: ``.venv/bin/python benchmarks/bench_au_eu.py``. A decoding step scores all its rows in one
call (the transformers recorder and llama.cpp's numpy scoring alike); this times that call for
1 and 8 rows, K = 2 and 5, both evidence modes, and prints microseconds per step next to the
share of a 9 ms step (the embedded model on llama.cpp, 2 CPUs: about 109 tokens/s).
"""

from __future__ import annotations

import random
import timeit

from logtoku_guard.scoring.uncertainty import token_logtoku

STEP_MS = 9.2  # one decoding step of the embedded model on llama.cpp, 2 CPUs (README: ~109 tokens/s)


def main() -> None:
    rng = random.Random(0)
    print(f"{'rows':>4} {'K':>2} {'evidence':>8} {'us/step':>8} {'share of a 9.2 ms step':>24}")
    for rows in (1, 8):
        for k in (2, 5):
            values = [[rng.gauss(8.0, 4.0) for _ in range(k)] for _ in range(rows)]
            for evidence in ("clamped", "raw"):
                n = 3000
                seconds = min(timeit.repeat(lambda: token_logtoku(values, evidence), number=n, repeat=3)) / n  # noqa: B023
                print(f"{rows:>4} {k:>2} {evidence:>8} {seconds * 1e6:>8.1f} {seconds * 1e3 / STEP_MS:>23.2%}")


if __name__ == "__main__":
    main()
