#!/usr/bin/env python
"""TransformersBackend vs LlamaCppBackend on the embedded model: tokens/s, RSS, cold load, concurrency.

Same prompts, greedy, ``--tokens`` new tokens each, scoring included (each backend's public
``generate``: every token's top-K, AU/EU, log-probability and entropy, and the question's prompt
scores). Measured, never asserted:

1. tokens/s at 1 and 2 threads (``threads=`` / ``n_threads=``), runs interleaved (transformers,
   llama.cpp, transformers...) over ``--repeats`` rounds of the prompts: total generated
   tokens / total wall time of the calls, and the ratio llama.cpp / transformers;
2. the scoring overhead of the llama.cpp backend: the same greedy tokens from a bare loop on
   the same llama.cpp context (decode, copy the logits, arg-max; nothing scored), interleaved;
3. cold load and peak RSS: a fresh Python process per backend loads it and answers one prompt
   (``resource.getrusage`` max RSS; the transformers figure uses its converted cache), then
   reads the answer's response score (``g.reliability``, what a guard or the server reads; torch
   stays out of the llama.cpp process: ``torch_after_score``);
4. throughput with 8 concurrent requests (threads) vs the same 8 requests one after another,
   on the llama.cpp backend, with the time spent outside ``llama_decode`` per token;
5. llama.cpp's own batching ceiling (``--parts ceiling``): the median ``llama_decode`` step of
   1 row and of 8 rows (one sequence each, one call) on the backend's context, at 1 and 2
   threads; 8 rows' tokens/s over 1 row's is the most any batching on top can gain
   (``--requantize q4_0,q8_0``: also for the embedded model re-quantised to those types);
6. time to first token of a long prompt (``--parts long``, ``--prompt-tokens`` ~1,900): process
   CPU time of ``generate`` with one new token, our backend with the question scored at prefill,
   the same with ``score_prompt`` off, a bare ``llama_decode`` of the same ids (logits at the
   last position only), and the transformers backend (``--with-transformers``), interleaved
   over ``--repeats`` rounds; ``--weights q4_1,q8_0`` runs each listed weight type of the
   embedded model (:func:`~logtoku_guard.backends.embedded.embedded_llama_gguf`). CPU time, not wall:
   on a shared machine other processes stretch the wall clock but not this process's CPU time;
7. cold start (``--parts cold_ask``): child CPU time, wall time and peak RSS of ``logtoku-guard ask --backend
   llamacpp --max-new-tokens 1`` (imports, the model's load, the guard, the default audit store) against
   a bare llama-cpp-python script answering the same question with one token on the same weights (the
   default type), interleaved (median of ``--repeats`` runs each); ``--parts ask_phases``: the CPU time
   of each import group and each step of the same ``ask`` (a fresh process per run), where the
   difference goes;
8. scored decode against bare (``--parts decode_cpu``): process CPU time per token of a greedy
   ``--tokens`` answer through ``generate`` (every token scored; also with ``max_logprobs=0``, each
   step searching only AU/EU's K) and of the bare loop's same tokens, at 1 and 2 threads,
   interleaved; the prefill of the short prompt is included in each;
9. weights against the transformers backend (``--parts agreement``): the first ``--questions`` of the
   ordinary benchmark's tune half (every category, sentence wording first), greedy ``--tokens``,
   answered by the transformers backend (float32 weights de-quantised from the shipped file) and by
   llama.cpp on each ``--weights`` type: the share of answers identical to transformers' (and whose
   first 8 tokens are), the share judged correct against the references, the README's France answer,
   and the process CPU time per answer (``--workers`` requests at a time: the backends batch them);
10. flash attention (``--parts flash_attn``): llama.cpp's default (auto: on for this CPU build) against
   off, 1 thread, CPU ms of a decoding step at context depths 30 to 7,036 and of the prefill's units
   deep in a long prompt (a 128-token chunk, an 8-token piece), where a short request beside a long
   prompt waits.
11. the second context (``--parts side_context``): a short row's decoding step alone, beside a
   6,000-token sequence in the same context, and while a second context on the same weights prefills
   in another thread (what ``concurrent_prefill`` rests on), then the copy of that sequence's KV cells
   into the first context: its time and the next token's largest logit difference (0.0: exact).

    python benchmarks/bench_llamacpp.py --cache-dir /tmp/ltg-cache

Needs the ``llamacpp`` extra. The load average is printed: other processes move the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of the French Revolution?",
    "Describe the water cycle in detail.",
    "Give me advice for learning to play the guitar.",
]

CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
kind, cache = sys.argv[1], sys.argv[2]
from logtoku_guard.types import DecodingOptions
if kind == "llamacpp":
    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    b = LlamaCppBackend("embedded", n_threads=2)
else:
    from logtoku_guard.backends.transformers import TransformersBackend
    b = TransformersBackend(None, cache_dir=cache, threads=2)
load = time.perf_counter() - t0
g = b.generate("What is the capital of France?", DecodingOptions(max_new_tokens=16))
first = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
g.reliability  # the response score: what a guard or the server reads next
rss_scored = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"load_s": load, "first_answer_s": first, "peak_rss_mib": rss, "torch_after_score": "torch" in sys.modules,
                  "peak_rss_mib_after_score": rss_scored, "tokens": len(g.tokens)}))
"""


def timed(fn: Any) -> tuple[float, int]:
    t = time.perf_counter()
    n = fn()
    return time.perf_counter() - t, n


def bare_loop(b: Any, prompt: str, tokens: int) -> int:
    """Greedy tokens from the backend's llama.cpp context with nothing scored: decode, copy, arg-max."""
    import numpy as np

    from logtoku_guard.types import to_messages

    ids = b.tokenizer.encode(b.render(to_messages(prompt)))
    m = b._model
    out = np.empty(m.n_vocab, dtype=np.float32)
    n = 0
    with b._lock:
        try:
            m.decode([(t, p, 0, p == len(ids) - 1) for p, t in enumerate(ids)])
            m.logits_into(len(ids) - 1, out)
            pos = len(ids)
            for _ in range(tokens):
                token = int(out.argmax())
                if token in b._eos_ids:
                    break
                n += 1
                m.decode([(token, pos, 0, True)])
                m.logits_into(0, out)
                pos += 1
        finally:
            m.clear()
    return n


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    from logtoku_guard.backends.transformers import TransformersBackend
    from logtoku_guard.types import DecodingOptions

    opts = DecodingOptions(max_new_tokens=args.tokens)
    out: dict[str, Any] = {}
    for threads in (1, 2):
        tb = TransformersBackend(None, cache_dir=args.cache_dir, threads=threads)
        lb = LlamaCppBackend("embedded", n_threads=threads)
        for b in (tb, lb):
            b.generate(PROMPTS[0], DecodingOptions(max_new_tokens=4))  # warm up
        totals = {"transformers": [0.0, 0], "llamacpp": [0.0, 0], "llamacpp_bare": [0.0, 0]}
        for _ in range(args.repeats):
            for p in PROMPTS:
                for name, fn in (
                    ("transformers", lambda p=p, b=tb: len(b.generate(p, opts).tokens)),
                    ("llamacpp", lambda p=p, b=lb: len(b.generate(p, opts).tokens)),
                    ("llamacpp_bare", lambda p=p, b=lb: bare_loop(b, p, args.tokens)),
                ):
                    s, n = timed(fn)
                    totals[name][0] += s
                    totals[name][1] += n
        rates = {name: n / s for name, (s, n) in totals.items()}
        out[f"threads={threads}"] = {
            "tokens_per_s": rates,
            "tokens": {name: n for name, (_, n) in totals.items()},
            "llamacpp_vs_transformers": rates["llamacpp"] / rates["transformers"],
            "scoring_overhead": rates["llamacpp_bare"] / rates["llamacpp"] - 1.0,
        }
        print(json.dumps({f"threads={threads}": out[f"threads={threads}"]}, indent=1), flush=True)
        lb.close()
    return out


def decode_timer(b: Any) -> list[float]:
    """Wrap ``b``'s ``llama_decode`` calls; the returned list's first item accumulates their seconds."""
    spent = [0.0]
    m = b._model
    decode = m.decode

    def timed(entries: Any) -> None:
        t = time.perf_counter()
        try:
            decode(entries)
        finally:
            spent[0] += time.perf_counter() - t

    m.decode = timed
    return spent


def concurrency(args: argparse.Namespace) -> dict[str, Any]:
    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    from logtoku_guard.types import DecodingOptions

    opts = DecodingOptions(max_new_tokens=args.tokens)
    b = LlamaCppBackend("embedded", n_threads=2, max_batch=8)
    spent = decode_timer(b)
    prompts = (PROMPTS * 2)[:8]
    b.generate(prompts[0], DecodingOptions(max_new_tokens=4))
    counts: list[int] = []

    def ask(p: str) -> None:
        counts.append(len(b.generate(p, opts).tokens))

    def together() -> int:
        counts.clear()
        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts)

    runs: dict[str, list[float]] = {"serial": [0.0, 0, 0.0], "concurrent": [0.0, 0, 0.0]}
    for _ in range(args.repeats):  # interleaved: serial, concurrent, serial...
        for name, fn in (("serial", lambda: sum(len(b.generate(p, opts).tokens) for p in prompts)), ("concurrent", together)):
            spent[0] = 0.0
            s, n = timed(fn)
            runs[name][0] += s
            runs[name][1] += n
            runs[name][2] += spent[0]
    b.close()
    res: dict[str, Any] = {}
    for name, (secs, count, d) in runs.items():
        res[f"{name}_tokens_per_s"] = count / secs
        res[f"{name}_outside_decode_ms_per_token"] = 1000 * (secs - d) / count
        res[f"{name}_outside_decode_share"] = (secs - d) / secs
    res["ratio"] = res["concurrent_tokens_per_s"] / res["serial_tokens_per_s"]
    print(json.dumps({"concurrency_8": res}, indent=1), flush=True)
    return res


def requantized(kinds: list[str], folder: Path) -> dict[str, Path]:
    """The embedded GGUF re-quantised to each of ``kinds`` (``q4_0``, ``q8_0``...) in ``folder``, for the ceiling part."""
    import llama_cpp

    from logtoku_guard.backends.embedded import embedded_gguf_path

    out = {}
    for kind in kinds:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}")
        params.allow_requantize = True
        target = folder / f"embedded-{kind}.gguf"
        if llama_cpp.llama_model_quantize(str(embedded_gguf_path()).encode(), str(target).encode(), params) != 0:
            raise SystemExit(f"llama.cpp could not re-quantise the embedded model to {kind}")
        out[kind] = target
    return out


def ceiling(args: argparse.Namespace) -> dict[str, Any]:
    """Median ``llama_decode`` step of 1 and of 8 rows on the backend's own context: llama.cpp's batching gain.

    With ``--requantize q4_0,q8_0`` the same for the embedded model re-quantised to those types
    (llama.cpp's matrix-multiplication kernels differ by type), interleaved with the shipped Q4_1.
    """
    import statistics
    import tempfile

    import numpy as np

    from logtoku_guard.backends.llamacpp import LlamaCppBackend

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        kinds = [k.strip() for k in args.requantize.split(",") if k.strip()]
        models: dict[str, Any] = {"embedded": "embedded", **requantized(kinds, Path(tmp))}
        for threads in (1, 2):
            backends = {name: LlamaCppBackend(model, n_threads=threads, max_batch=8) for name, model in models.items()}
            steps: dict[tuple[str, int], list[float]] = {(name, rows): [] for name in backends for rows in (1, 8)}
            for _ in range(args.repeats):
                for (name, rows), times in steps.items():  # interleaved
                    b = backends[name]
                    m = b._model
                    prompt = b.tokenizer.encode(b.render(PROMPTS[0]))
                    logits = np.empty(m.n_vocab, dtype=np.float32)
                    with b._lock:
                        for seq in range(rows):  # each row's prompt alone, as the backend prefills it
                            m.decode([(t, p, seq, p == len(prompt) - 1) for p, t in enumerate(prompt)])
                        last, pos = [int(prompt[-1])] * rows, len(prompt)
                        for _ in range(args.tokens):
                            t = time.perf_counter()
                            m.decode([(last[r], pos, r, True) for r in range(rows)])
                            times.append(time.perf_counter() - t)
                            for r in range(rows):
                                m.logits_into(r, logits)
                                last[r] = int(logits.argmax())
                            pos += 1
                        m.clear()
            for b in backends.values():
                b.close()
            for name in backends:
                med = {rows: statistics.median(steps[name, rows]) for rows in (1, 8)}
                key = f"{name} threads={threads}"
                out[key] = {
                    "step_ms": {f"rows={r}": 1000 * v for r, v in med.items()},
                    "tokens_per_s": {f"rows={r}": r / v for r, v in med.items()},
                    "batching_gain_8_rows": 8 * med[1] / med[8],
                }
                print(json.dumps({"ceiling": {key: out[key]}}, indent=1), flush=True)
    return out


def long_prompt(args: argparse.Namespace) -> dict[str, Any]:
    """CPU time to the first token of a ~``--prompt-tokens`` prompt: ours scored / unscored / bare / transformers."""
    import statistics

    import numpy as np

    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    from logtoku_guard.types import DecodingOptions, to_messages

    one = DecodingOptions(max_new_tokens=1)
    sentence = "The history of the lighthouse, told slowly and in detail, with every keeper's name. "
    prompt = sentence * max(1, args.prompt_tokens // 18)
    out: dict[str, Any] = {}
    for weights in [w.strip() for w in args.weights.split(",") if w.strip()]:
        b = LlamaCppBackend("embedded", n_threads=1, weights=weights, cache_dir=args.cache_dir)
        ids = b._prepare(to_messages(prompt), one).ids
        m = b._model
        logits = np.empty(m.n_vocab, dtype=np.float32)

        def bare(b: Any = b, m: Any = m, ids: list[int] = ids, logits: Any = logits) -> None:
            with b._lock:
                try:
                    m.decode([(t, p, 0, p == len(ids) - 1) for p, t in enumerate(ids)])
                    m.logits_into(len(ids) - 1, logits)
                finally:
                    m.clear()

        def ours(scored: bool, b: Any = b) -> None:
            b.score_prompt = scored
            b.generate(prompt, one)

        runs: dict[str, Any] = {"scored": lambda: ours(True), "unscored": lambda: ours(False), "bare": bare}
        if args.with_transformers and "transformers" not in out:
            from logtoku_guard.backends.transformers import TransformersBackend

            tb = TransformersBackend(None, cache_dir=args.cache_dir, threads=1)
            runs["transformers"] = lambda tb=tb: tb.generate(prompt, one)
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, fn in runs.items():  # interleaved
                start = time.process_time()
                fn()
                cpu[name].append(time.process_time() - start)
        b.close()
        med = {name: statistics.median(v) for name, v in cpu.items()}
        res = {"prompt_tokens": len(ids), "cpu_s": med, "runs": cpu}
        res["scored_over_bare"] = med["scored"] / med["bare"]
        res["unscored_over_bare"] = med["unscored"] / med["bare"]
        if "transformers" in med:
            out["transformers"] = {"cpu_s": med["transformers"], "runs": cpu["transformers"]}
            res["scored_over_transformers"] = med["scored"] / med["transformers"]
        out[f"llamacpp {weights}"] = res
        print(json.dumps({"long": {f"llamacpp {weights}": res}}, indent=1), flush=True)
    return out


def flash_attn(args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp's flash attention, off against its default (auto: on for this CPU build), on the embedded
    model's default weights, 1 thread: CPU ms of one decoding step at a context depth (best of two runs of 24
    steps), and of a 128-token chunk and an 8-token piece of a prompt about 6,900 tokens deep (the chunked
    prefill's units beside a long prompt)."""
    from logtoku_guard.backends.embedded import embedded_llama_gguf
    from logtoku_guard.backends.llamacpp_model import LlamaModel

    path = embedded_llama_gguf(None, args.cache_dir)
    ids = [(i % 5000) + 100 for i in range(7200)]
    out: dict[str, Any] = {}
    for name, setting in (("auto (default)", None), ("off", False)):
        m = LlamaModel(path, n_ctx=7296, n_seq=1, n_threads=1, flash_attn=setting)
        row: dict[str, float] = {}
        for depth in (30, 300, 1200):
            best = math.inf
            for _ in range(2):
                m.clear()
                for lo in range(0, depth, 512):
                    m.decode([(ids[p], p, 0, p == depth - 1) for p in range(lo, min(depth, lo + 512))])
                start = time.process_time()
                for k in range(24):
                    m.decode([(ids[depth + k], depth + k, 0, True)])
                best = min(best, (time.process_time() - start) / 24)
            row[f"decode step at depth {depth}, ms"] = 1000 * best
        m.clear()
        for lo in range(0, 6900, 512):
            m.decode([(ids[p], p, 0, False) for p in range(lo, min(6900, lo + 512))])
        for label, lo, n in (("128-token chunk at 6900, ms", 6900, 128), ("8-token piece at 7028, ms", 7028, 8)):
            start = time.process_time()
            m.decode([(ids[p], p, 0, p == lo + n - 1) for p in range(lo, lo + n)])
            row[label] = 1000 * (time.process_time() - start)
        start = time.process_time()
        for k in range(8):
            m.decode([(ids[7036 + k], 7036 + k, 0, True)])
        row["decode step at depth 7036, ms"] = 1000 * (time.process_time() - start) / 8
        m.close()
        out[name] = row
    out["off / auto"] = {k: out["off"][k] / out["auto (default)"][k] for k in out["off"]}
    print(json.dumps({"flash_attn": out}, indent=1), flush=True)
    return out


def side_context(args: argparse.Namespace) -> dict[str, Any]:
    """What the concurrent prefill rests on (issue 42 item 4), embedded default weights, 1 thread each:
    a short row's decoding step (median of 40, wall ms) alone, beside a 6,000-token sequence in the same
    context, and while a second context on the same weights prefills 3,000 tokens in another thread (the
    side context's prefill, and the same alone, in seconds); then copying that sequence into the first
    context (``LlamaContext.copy_sequence``: its bytes, seconds) and the largest difference between the
    next token's logits there and in the side context (0.0: exact)."""
    import statistics
    import threading

    import numpy as np

    from logtoku_guard.backends.embedded import embedded_llama_gguf
    from logtoku_guard.backends.llamacpp_model import LlamaModel

    m = LlamaModel(embedded_llama_gguf(None, args.cache_dir), n_ctx=8192, n_seq=4, n_threads=1)
    side = m.side_context()
    rng = np.random.default_rng(0)
    short = [int(t) for t in rng.integers(100, 40000, 30)]
    long_ids = [int(t) for t in rng.integers(100, 40000, 6001)]

    def prefill(ctx: Any, seq: int, n: int) -> None:
        for lo in range(0, n, 512):
            ctx.decode([(long_ids[p], p, seq, False) for p in range(lo, min(n, lo + 512))])

    def steps(count: int = 40) -> float:
        m.decode([(t, p, 0, p == len(short) - 1) for p, t in enumerate(short)])
        times = []
        for k in range(count):
            t = time.perf_counter()
            m.decode([(short[k % 30], 30 + k, 0, True)])
            times.append(time.perf_counter() - t)
        m.forget(0)
        return 1000 * statistics.median(times)

    out: dict[str, Any] = {"decode step alone, ms": steps()}
    prefill(m, 1, 6000)
    out["beside a 6,000-token sequence in the same context, ms"] = steps()
    m.clear()
    took: dict[str, float] = {}

    def side_prefill() -> None:
        t = time.perf_counter()
        prefill(side, 1, 3000)
        took["s"] = time.perf_counter() - t

    thread = threading.Thread(target=side_prefill)
    thread.start()
    time.sleep(0.05)
    out["while the side context prefills 3,000 tokens, ms"] = steps(60)
    thread.join()
    out["side prefill of 3,000 tokens meanwhile, s"] = took["s"]
    side.clear()
    t = time.perf_counter()
    prefill(side, 1, 3000)
    out["side prefill of 3,000 tokens alone, s"] = time.perf_counter() - t
    side.decode([(long_ids[3000], 3000, 1, True)])
    want = side.logits_rows([0]).copy()
    side.forget(1)
    prefill(side, 1, 3000)
    m.decode([(t, p, 0, False) for p, t in enumerate(short)])  # the copy lands beside another sequence's cells
    t = time.perf_counter()
    copied = m.copy_sequence(side, 1)
    out["copy 3,000 tokens' cells, s"] = time.perf_counter() - t
    m.decode([(long_ids[3000], 3000, 1, True)])
    out["copied"] = copied
    out["next token's logits, largest difference"] = float(np.abs(m.logits_rows([0]) - want).max())
    m.close()
    print(json.dumps({"side_context": out}, indent=1), flush=True)
    return out


def decode_cpu(args: argparse.Namespace) -> dict[str, Any]:
    """CPU time per token of a scored greedy answer against the bare loop's same tokens, 1 and 2 threads."""
    import statistics

    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    from logtoku_guard.types import DecodingOptions

    prompt = PROMPTS[1]
    opts = DecodingOptions(max_new_tokens=args.tokens)
    out: dict[str, Any] = {}
    for threads in (int(t) for t in args.threads.split(",")):
        b = LlamaCppBackend("embedded", n_threads=threads)
        # The same scoring with only AU/EU's K searched per step (max_logprobs=0: no wider top_logprobs kept):
        # what searching "only the K a step needs" gains at most (issue 42 item 3).
        b_k = LlamaCppBackend("embedded", n_threads=threads, max_logprobs=0)
        for warm in (b, b_k):
            warm.generate(prompt, DecodingOptions(max_new_tokens=4))
        per_token: dict[str, list[float]] = {"scored": [], "scored_k_only": [], "bare": []}
        counts: dict[str, int] = {}
        for _ in range(args.repeats):
            for name in per_token:  # interleaved
                start = time.process_time()
                if name == "bare":
                    n = bare_loop(b, prompt, args.tokens)
                else:
                    n = len((b if name == "scored" else b_k).generate(prompt, opts).tokens)
                per_token[name].append((time.process_time() - start) / n)
                counts[name] = n
        b.close()
        b_k.close()
        med = {name: statistics.median(v) for name, v in per_token.items()}
        out[f"threads={threads}"] = {
            "cpu_ms_per_token": {name: 1000 * v for name, v in med.items()},
            "tokens": counts,
            "bare_over_scored_speed": med["bare"] / med["scored"],
            "bare_over_scored_k_only_speed": med["bare"] / med["scored_k_only"],
        }
        print(json.dumps({"decode_cpu": {f"threads={threads}": out[f"threads={threads}"]}}, indent=1), flush=True)
    return out


BARE_ASK = """
import sys
from llama_cpp import Llama
llm = Llama(sys.argv[1], n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
out = llm.create_chat_completion([{"role": "user", "content": sys.argv[2]}], max_tokens=1, temperature=0.0)
print(out["choices"][0]["message"]["content"])
"""


ASK_PHASES = """
import json, sys, time
marks = []
def mark(name):
    marks.append((name, time.process_time()))
start = time.process_time()
import typer, rich.console, rich.table; mark("import typer + rich")
import pydantic; mark("import pydantic")
import numpy; mark("import numpy")
import logtoku_guard; mark("import logtoku_guard")
import logtoku_guard.cli, logtoku_guard.cli.guard_commands; mark("import logtoku_guard.cli and ask's command module")
from logtoku_guard.cli.plugins import add_plugins; add_plugins(logtoku_guard.cli.app); mark("CLI plugins (found when needed)")
from logtoku_guard.calibration import profile_path
from logtoku_guard.decision.policy import default_policy
from logtoku_guard.guard.guard import Guard
mark("import guard, policy, calibration")
import sqlalchemy; mark("import sqlalchemy")
import logtoku_guard.audit.store; mark("import the audit store")
import llama_cpp; mark("import llama_cpp")
import logtoku_guard.backends.llamacpp; mark("import our llama.cpp backend")
from logtoku_guard.cli import _common
from logtoku_guard.types import DecodingOptions
rules = default_policy(); mark("default policy")
audit = _common.open_store(sys.argv[2], None); mark("open the audit store")
backend = _common.load_backend("embedded", 2, "auto", "auto", None, backend="llamacpp"); mark("load the model")
profile, _ = _common.profile_for(backend, None, None, None); mark("read its profile")
guard = Guard(backend, rules, store=audit, profile=profile, options=DecodingOptions(max_new_tokens=1)); mark("Guard()")
result = guard.run(sys.argv[1]); mark("guard.run (1 token, its record written)")
prev, out = start, {}
for name, t in marks:
    out[name] = round(1000 * (t - prev), 1)
    prev = t
out["total"] = round(1000 * (prev - start), 1)
print(json.dumps(out))
"""


def ask_phases(args: argparse.Namespace) -> dict[str, Any]:
    """Where a cold ``ask --backend llamacpp`` spends its CPU: each import group and each step of the
    command (as ``ask`` runs them), in a fresh process per run; median ms of ``--repeats`` runs."""
    import statistics
    import tempfile

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    if args.cache_dir is not None:
        env["LOGTOKU_GUARD_CACHE"] = str(args.cache_dir)
    env = with_bytecode(env)
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats + 1):  # the first run checks the build and makes the store: not counted
            command = [sys.executable, "-c", ASK_PHASES, "What is the capital of France?", str(Path(tmp) / "audit.db")]
            proc = subprocess.run(command, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise SystemExit(f"ask_phases failed: {proc.stderr[-2000:]}")
            if i:
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    res = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    print(json.dumps({"ask_phases_cpu_ms": res}, indent=1), flush=True)
    return res


def with_bytecode(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a cold start's child that reads compiled bytecode, as an installed package does (pip
    compiles it): ``PYTHONDONTWRITEBYTECODE`` (set in some environments) would leave this checkout's
    modules, unlike site-packages', compiled from source at every start. The cache is kept apart
    (``PYTHONPYCACHEPREFIX``) and written by the uncounted first run."""
    import tempfile

    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "logtoku-bench-pycache")
    return env


def child_cpu(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds (user + system) and peak RSS (MiB) of one child process running ``command`` (its own
    resource usage, read by ``os.wait4`` when it ends)."""
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env) as proc:
        assert proc.stderr is not None
        err = proc.stderr.read()  # to the end (not communicate(): it would reap the child before wait4)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if proc.returncode != 0:
        raise SystemExit(f"{command[:3]} failed: {err.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def cold_ask(args: argparse.Namespace) -> dict[str, Any]:
    """``logtoku-guard ask --backend llamacpp`` (one new token, the default audit store) against a bare
    llama-cpp-python script answering the same question with one token: child CPU time, interleaved."""
    import statistics

    from logtoku_guard.backends.embedded import embedded_llama_gguf

    question = "What is the capital of France?"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    if args.cache_dir is not None:
        env["LOGTOKU_GUARD_CACHE"] = str(args.cache_dir)
    ours = [sys.executable, "-m", "logtoku_guard.cli", "ask", "--backend", "llamacpp", "--max-new-tokens", "1", question]
    # The same weights as ours: the default type ($LOGTOKU_GUARD_LLAMACPP_WEIGHTS), converted once beforehand.
    bare = [sys.executable, "-c", BARE_ASK, str(embedded_llama_gguf(None, args.cache_dir)), question]
    env = with_bytecode(env)
    child_cpu(ours, env)  # the first use checks the build and writes the store (and bytecode): not a cold start's cost
    child_cpu(bare, env)
    runs: dict[str, list[float]] = {"ours": [], "bare": []}
    walls: dict[str, list[float]] = {"ours": [], "bare": []}
    rss: dict[str, list[float]] = {"ours": [], "bare": []}
    for _ in range(args.repeats):
        for name, command in (("ours", ours), ("bare", bare)):
            start = time.perf_counter()
            cpu, peak = child_cpu(command, env)
            walls[name].append(time.perf_counter() - start)
            runs[name].append(cpu)
            rss[name].append(peak)
    med = {name: statistics.median(v) for name, v in runs.items()}
    wall = {name: statistics.median(v) for name, v in walls.items()}
    peak_rss = {name: statistics.median(v) for name, v in rss.items()}
    res = {"cpu_s": med, "cpu_ratio": med["ours"] / med["bare"], "wall_s": wall, "wall_ratio": wall["ours"] / wall["bare"]}
    res |= {"peak_rss_mib": peak_rss, "rss_ratio": peak_rss["ours"] / peak_rss["bare"]}
    res["runs"] = {"cpu": runs, "wall": walls, "peak_rss_mib": rss}
    print(json.dumps({"cold_ask": res}, indent=1), flush=True)
    return res


def cold(args: argparse.Namespace) -> dict[str, Any]:
    res = {}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    for kind in ("transformers", "llamacpp"):
        proc = subprocess.run([sys.executable, "-c", CHILD, kind, str(args.cache_dir)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        res[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    res["rss_ratio"] = res["transformers"]["peak_rss_mib"] / res["llamacpp"]["peak_rss_mib"]
    res["load_ratio"] = res["transformers"]["load_s"] / res["llamacpp"]["load_s"]
    print(json.dumps({"cold": res}, indent=1), flush=True)
    return res


FRANCE = "What is the capital of France?"


def agreement(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy answers of each llama.cpp weight type against the transformers backend's, on tune questions."""
    from concurrent.futures import ThreadPoolExecutor

    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    from logtoku_guard.backends.transformers import TransformersBackend
    from logtoku_guard.calibration.self_labels import answer_matches, ordinary_questions
    from logtoku_guard.types import DecodingOptions

    questions = ordinary_questions("tune")[: args.questions]
    opts = DecodingOptions(max_new_tokens=args.tokens)

    def answer_all(b: Any) -> tuple[list[Any], float]:
        b.generate(FRANCE, DecodingOptions(max_new_tokens=4))  # warm-up
        start = time.process_time()
        with ThreadPoolExecutor(args.workers) as pool:
            made = list(pool.map(lambda q: b.generate(q.question, opts), questions))
        return made, (time.process_time() - start) / max(1, len(questions))

    tb = TransformersBackend(None, cache_dir=args.cache_dir, threads=2)
    reference, cpu = answer_all(tb)
    france = tb.generate(FRANCE, opts).text
    del tb
    correct = [answer_matches(g.text, q.answers)[0] for g, q in zip(reference, questions, strict=True)]
    out: dict[str, Any] = {
        "questions": len(questions),
        "transformers": {"correct": sum(correct) / len(questions), "cpu_s_per_answer": cpu, "france": france},
    }
    print(json.dumps({"agreement": out}, indent=1), flush=True)
    for weights in [w.strip() for w in args.weights.split(",") if w.strip()]:
        lb = LlamaCppBackend("embedded", n_threads=2, weights=weights, cache_dir=args.cache_dir)
        made, cpu = answer_all(lb)
        france = lb.generate(FRANCE, opts).text
        lb.close()
        same = [g.text == r.text for g, r in zip(made, reference, strict=True)]
        start8 = [[t.id for t in g.tokens[:8]] == [t.id for t in r.tokens[:8]] for g, r in zip(made, reference, strict=True)]
        right = [answer_matches(g.text, q.answers)[0] for g, q in zip(made, questions, strict=True)]
        res = {
            "identical": sum(same) / len(same),
            "first_8_tokens_identical": sum(start8) / len(start8),
            "correct": sum(right) / len(right),
            "correct_where_transformers_correct": sum(r and c for r, c in zip(right, correct, strict=True))
            / max(1, sum(correct)),
            "cpu_s_per_answer": cpu,
            "france": france,
        }
        out[f"llamacpp {weights}"] = res
        print(json.dumps({"agreement": {f"llamacpp {weights}": res}}, indent=1), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=None, help="the model cache (transformers' copy, llama.cpp's F16/Q8_0)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the 5 prompts")
    parser.add_argument("--requantize", default="", help="ceiling: also the embedded model as these types (q4_0,q8_0)")
    parser.add_argument("--prompt-tokens", type=int, default=1900, help="long: the long prompt's length, about")
    parser.add_argument("--weights", default="q4_1", help="long, agreement: the embedded model's weight types (q4_1,q8_0,f16)")
    parser.add_argument("--questions", type=int, default=150, help="agreement: the ordinary tune questions answered")
    parser.add_argument("--workers", type=int, default=8, help="agreement: requests in flight at a time")
    parser.add_argument("--with-transformers", action="store_true", help="long: the transformers backend too")
    parser.add_argument("--threads", default="1,2", help="decode_cpu: the thread counts to run")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--parts", default="cold,throughput,concurrency,ceiling", help="comma-separated parts to run")
    args = parser.parse_args()
    parts = {
        "cold": cold,
        "throughput": throughput,
        "concurrency": concurrency,
        "ceiling": ceiling,
        "long": long_prompt,
        "cold_ask": cold_ask,
        "ask_phases": ask_phases,
        "decode_cpu": decode_cpu,
        "flash_attn": flash_attn,
        "side_context": side_context,
        "agreement": agreement,
    }
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in parts]
    if unknown:
        parser.error(f"unknown --parts {unknown}; choose among {', '.join(parts)}")
    print(f"load average at start: {os.getloadavg()}", flush=True)
    result: dict[str, Any] = {name: parts[name](args) for name in chosen}
    result["loadavg_end"] = os.getloadavg()
    print(f"load average at end: {result['loadavg_end']}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
