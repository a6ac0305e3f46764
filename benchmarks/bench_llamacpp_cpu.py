#!/usr/bin/env python
"""llama.cpp on a small shared CPU: a portable build against a native one, and the default thread count.

Two measurements on the embedded GGUF (SmolLM2-135M-Instruct, Q4_1), greedy, never asserted:

``--part build``: the cost of building llama.cpp portably (``scripts/install.sh``: GGML_NATIVE=OFF,
AVX2/FMA/F16C, no AVX-512, no AMX) against ``-march=native``. Each ``--python`` is the interpreter
of a virtual environment holding one build; a child process per run loads the model on
:class:`~logtoku_guard.backends.llamacpp_model.LlamaModel` (the backend's own context, nothing
scored) and times a ``--prompt-tokens`` prefill and ``--tokens`` single-token decodes at
``--threads``. Runs alternate between the builds over ``--repeats`` rounds; medians are printed
with the ratio of each build's tokens/s to the first's.

``--part threads``: :class:`~logtoku_guard.backends.llamacpp.LlamaCppBackend` at 1 and 2 threads,
alone and beside a CPU-bound process (``python -c "while True: pass"``): the prefill of the
README's question (``generate`` with one new token) and a ``--tokens``-token answer with every
token scored, medians over ``--repeats`` interleaved runs. ggml's worker threads spin while they
wait for each other, so on a machine with as many busy processes as cores, a second thread can
cost more than it brings: this is what chose the default (:func:`default_n_threads`).

    python benchmarks/bench_llamacpp_cpu.py --part build --python .venv/bin/python --python /tmp/native/bin/python
    python benchmarks/bench_llamacpp_cpu.py --part threads

The load average is printed: other processes on a shared machine move the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench_threads import competitor  # the same CPU-bound neighbour as the torch thread benchmark

QUESTION = "Who founded the Velmora Institute of Marine Acoustics, and in which year was it established?"

CHILD = """
import json, sys, time
import numpy as np
from logtoku_guard.backends.llamacpp_check import installed_build
from logtoku_guard.backends.llamacpp_model import LlamaModel, LlamaTokenizer
from logtoku_guard.backends.embedded import embedded_gguf_path
n_prompt, n_new, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
m = LlamaModel(embedded_gguf_path(), n_ctx=1024, n_seq=1, n_threads=threads)
ids = LlamaTokenizer(m).encode("The history of the lighthouse, told slowly and in detail. " * 40)[:n_prompt]
out = np.empty(m.n_vocab, dtype=np.float32)
t0 = time.perf_counter()
m.decode([(t, p, 0, p == len(ids) - 1) for p, t in enumerate(ids)])
t1 = time.perf_counter()
index = len(ids) - 1
for step in range(n_new):
    m.logits_into(index, out)
    m.decode([(int(out.argmax()), len(ids) + step, 0, True)])
    index = 0
t2 = time.perf_counter()
lib = m.lib
info = " ".join(bytes(lib.llama_print_system_info()).decode("utf-8", "replace").split())
rates = {"prefill_tps": len(ids) / (t1 - t0), "decode_tps": n_new / (t2 - t1)}
print(json.dumps({**rates, "build": installed_build().describe(), "info": info}))
"""


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def part_build(args: argparse.Namespace) -> None:
    pythons: list[str] = args.python or [sys.executable]
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in pythons}
    about: dict[str, dict[str, str]] = {}
    for _ in range(args.repeats):
        for python in pythons:
            cmd = [python, "-c", CHILD, str(args.prompt_tokens), str(args.tokens), str(args.threads)]
            row = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
            about[python] = {"build": row.pop("build"), "info": row.pop("info")}
            runs[python].append(row)
    print(
        f"build comparison: {args.prompt_tokens}-token prefill, {args.tokens} decodes, {args.threads} thread(s), "
        f"median of {args.repeats}; load average {load()}"
    )
    base: dict[str, float] = {}
    for python in pythons:
        med = {key: statistics.median(r[key] for r in runs[python]) for key in ("prefill_tps", "decode_tps")}
        base = base or med
        print(f"  {python}\n    {about[python]['build']}\n    CPU features: {about[python]['info']}")
        print(
            f"    prefill {med['prefill_tps']:8.1f} tok/s ({med['prefill_tps'] / base['prefill_tps']:.2f}x)   "
            f"decode {med['decode_tps']:7.1f} tok/s ({med['decode_tps'] / base['decode_tps']:.2f}x)   "
            f"runs: {[round(r['decode_tps'], 1) for r in runs[python]]}"
        )


def part_threads(args: argparse.Namespace) -> None:
    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    from logtoku_guard.types import DecodingOptions

    backends = {n: LlamaCppBackend("embedded", n_threads=n, n_ctx=1024) for n in (1, 2)}
    one, answer = DecodingOptions(max_new_tokens=1), DecodingOptions(max_new_tokens=args.tokens)
    print(
        f"threads: LlamaCppBackend prefill of a {backends[1].count_tokens(QUESTION)}-token question (+ template) and a "
        f"{args.tokens}-token scored answer, median of {args.repeats}; os.cpu_count()={os.cpu_count()}"
    )
    for busy in (False, True):
        times: dict[int, dict[str, list[float]]] = {n: {"prefill": [], "answer": []} for n in backends}
        with competitor(busy):
            for _ in range(args.repeats):
                for n, backend in backends.items():
                    t0 = time.perf_counter()
                    backend.generate(QUESTION, one)
                    t1 = time.perf_counter()
                    g = backend.generate(QUESTION, answer)
                    t2 = time.perf_counter()
                    times[n]["prefill"].append(t1 - t0)
                    times[n]["answer"].append(len(g.tokens) / (t2 - t1))
            where = "beside a busy process" if busy else "alone"
            print(f"  {where} (load average {load()}):")
            for n in backends:
                p, a = statistics.median(times[n]["prefill"]), statistics.median(times[n]["answer"])
                print(
                    f"    n_threads={n}: prefill {p * 1000:7.0f} ms (range {min(times[n]['prefill']) * 1000:.0f}-"
                    f"{max(times[n]['prefill']) * 1000:.0f})   answer {a:6.1f} tok/s (range {min(times[n]['answer']):.1f}-"
                    f"{max(times[n]['answer']):.1f})"
                )
            ratio = statistics.median(times[2]["answer"]) / statistics.median(times[1]["answer"])
            print(f"    2 threads / 1 thread, answer tokens/s: {ratio:.2f}x")
    for backend in backends.values():
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("build", "threads"), required=True)
    parser.add_argument("--python", action="append", help="--part build: a venv's interpreter (repeat: one per build)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="--part build: llama.cpp threads")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    (part_build if args.part == "build" else part_threads)(args)


if __name__ == "__main__":
    main()
