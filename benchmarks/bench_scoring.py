#!/usr/bin/env python
"""Cost of LogTokU scoring on the embedded model (SmolLM2-135M-Instruct), CPU or CUDA.

Measures, in one process:

1. Per-token time of scored generation vs plain ``model.generate`` (greedy, same tokenized
   prompts, exactly N new tokens on every path), for each batch size; runs interleaved
   (order rotated every repeat) after a warm-up. Three paths:

   * ``plain``  - ``backend.model.generate(**enc, generation_config=cfg)``: no hook, no criterion.
   * ``hook``   - the same ``generate`` call with the backend's forward hook and stopping
     criterion (``StepRecorder``), built here exactly as ``TransformersBackend._run`` builds
     them: the per-step scoring cost alone.
   * ``api``    - ``backend.batch(prompts, DecodingOptions(max_new_tokens=N))``: the public
     path, which also renders the chat template, tokenizes and builds the ``Generation``; it
     runs the backend's own decode loop (``logtoku_guard/backends/decode_loop.py``, continuous
     batching), not ``generate``, so its figure also holds the difference between the two loops.

   Forcing exactly N tokens: transformers 5 refills a ``None`` ``eos_token_id`` from the
   model's own generation config, so "eos_token_id=None" does not disable EOS. Instead every
   path uses ``min_new_tokens == max_new_tokens == N`` (EOS is masked for N steps, and the
   EOS id stays set, as in ``_run``). For the ``api`` path, ``min_new_tokens`` is set on
   ``backend.model.generation_config`` for the duration of the benchmark (the decode loop builds
   the config's logits processors as ``generate`` does, per row); every run is checked to give N tokens per row
   and the same token ids as the plain path.

2. Memory: Python-heap bytes (``tracemalloc``) retained by the scored result per generated
   token, the size of the ``Generation`` object graph per token, the extra tracemalloc peak of
   scoring vs plain, and a census of live torch tensors (every tensor reachable by the garbage
   collector, deduplicated by storage) taken inside ``generate`` at the first and the last step,
   for plain and scored runs, plus the live tensors left after the run. RSS (``/proc/self/statm``)
   deltas are printed for information only (the allocator keeps freed pages).

3. Load times: cold (convert the embedded GGUF into a fresh temporary cache dir) and warm
   (a second construction from that cache dir); ``--skip-cold`` leaves the conversion out.

The headline overhead is the **paired CPU-time** ratio: for every repeat, the process CPU time
(``time.process_time``, all threads) of the scored path over that of the plain path run just
before or after it, minus 1; printed as the median of the repeats with its interquartile range
and min..max. CPU time is far less hurt than wall time by other processes on a shared machine,
and pairing cancels slow drifts; raise ``--repeats`` until the IQR is below the effect.

Run: ``LOGTOKU_GUARD_CACHE=/tmp/ltg-cache python benchmarks/bench_scoring.py [--tokens N]
[--repeats R] [--batch-sizes 1,8] [--threads N] [--json PATH] [--skip-cold] [--skip-memory]``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import warnings
from typing import Any

TARGET_OVERHEAD = 0.01  # issue 15 (was 2% in issue 2)
AIM_OVERHEAD = 0.005
TARGET_BYTES_PER_TOKEN = 1024
UNSTABLE_SPREAD = 0.10  # (max - min) / median of one path's repeats above this: timings not trustworthy

PROMPTS = [
    "Tell me a long story about a cat who learns to sail.",
    "Explain how a steam engine works, step by step.",
    "What is the capital of Australia, and why was it chosen?",
    "Describe the water cycle to a ten-year-old.",
    "List some tips for learning a new programming language.",
    "Why is the sky blue? Give a detailed answer.",
    "Write a short poem about autumn leaves.",
    "How do vaccines train the immune system?",
]


# -- helpers ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32, help="new tokens per generation, forced on every path (default 32)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per path and batch size (default 5)")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument(
        "--mem-tokens",
        default="32,128",
        help="two token counts for the memory-growth check, batch 1 (default 32,128)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads on every path (default: the backend's default_threads(); 0: torch's own default)",
    )
    p.add_argument("--skip-cold", action="store_true", help="do not time the cold load (GGUF conversion)")
    p.add_argument("--skip-memory", action="store_true", help="leave out section 2 (memory)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    args = p.parse_args(argv)
    try:
        args.batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
        args.mem_tokens = [int(x) for x in args.mem_tokens.split(",") if x.strip()]
    except ValueError:
        p.error("--batch-sizes and --mem-tokens take comma-separated integers")
    if args.tokens < 1 or args.repeats < 1 or not args.batch_sizes or min(args.batch_sizes) < 1:
        p.error("--tokens, --repeats and batch sizes must be positive")
    if len(args.mem_tokens) != 2 or min(args.mem_tokens) < 2 or args.mem_tokens[0] >= args.mem_tokens[1]:
        p.error("--mem-tokens takes two increasing integers >= 2, e.g. 32,128")
    return args


def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    cpu_model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cuda": torch.cuda.is_available(),
    }


def loadavg() -> str | None:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def live_tensors() -> tuple[int, int, list[tuple[int, ...]]]:
    """(count, bytes, shapes) of the torch tensors the garbage collector can see, deduplicated by storage."""
    import torch

    seen: set[tuple[str, int]] = set()
    count = nbytes = 0
    shapes: list[tuple[int, ...]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated torch aliases found by gc warns
        objects = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for obj in objects:
        try:
            if obj.is_meta:
                continue
            storage = obj.untyped_storage()
            key = (str(obj.device), storage.data_ptr())
        except Exception:  # exotic tensor subclasses: not ours
            continue
        if key in seen or key[1] == 0:
            continue
        seen.add(key)
        count += 1
        nbytes += storage.nbytes()
        shapes.append(tuple(obj.shape))
    return count, nbytes, shapes


def deep_sizeof(root: Any) -> int:
    """Bytes of the Python object graph under ``root`` (each object counted once)."""
    import torch

    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            total += obj.untyped_storage().nbytes()  # none expected: counted so it would show
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        if hasattr(obj, "__dict__"):
            stack.append(vars(obj))
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                stack.append(getattr(obj, slot))
        if hasattr(obj, "__dataclass_fields__") and not hasattr(obj, "__dict__"):
            for name in obj.__dataclass_fields__:
                stack.append(getattr(obj, name))
    return total


def contains_tensor(root: Any) -> bool:
    import torch

    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            return True
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dataclass_fields__"):
            stack.extend(getattr(obj, n) for n in obj.__dataclass_fields__)
    return False


# -- the three paths ------------------------------------------------------------------------------
class Bench:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.model = backend.model
        self.tok = backend.tokenizer
        self.scoring_cpu: list[float] = []

    def prompts(self, batch: int) -> list[str]:
        return [PROMPTS[i % len(PROMPTS)] for i in range(batch)]

    def encode(self, prompts: list[str]) -> Any:
        # Exactly as TransformersBackend._run renders and tokenizes.
        texts = [self.backend.render(p) for p in prompts]
        has_template = bool(getattr(self.tok, "chat_template", None))
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=not has_template)
        return enc.to(self.model.device)

    def config(self, n: int) -> Any:
        # Exactly the greedy settings of TransformersBackend._run, plus min_new_tokens = N.
        cfg = copy.deepcopy(self.model.generation_config)
        cfg.update(
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=self.tok.pad_token_id,
            eos_token_id=sorted(self.backend._eos_ids) or None,
            return_dict_in_generate=False,
            output_scores=False,
            output_logits=False,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
        )
        return cfg

    def plain(self, enc: Any, cfg: Any, extra_criteria: list[Any] | None = None) -> tuple[float, Any]:
        import torch

        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(**enc, generation_config=cfg, stopping_criteria=extra_criteria or None)
        return time.perf_counter() - start, out[:, enc["input_ids"].shape[1] :].tolist()

    def hooked(self, enc: Any, cfg: Any, extra_criteria: list[Any] | None = None) -> tuple[float, Any, Any]:
        """The scored generate call built from the backend's internals, as ``_run`` does."""
        import torch

        from logtoku_guard.backends.recorder import StepRecorder

        b = self.backend
        rows = int(enc["input_ids"].shape[0])
        recorder = StepRecorder(
            k=b.k,
            evidence=b.evidence,
            tokenizer=self.tok,
            rows=rows,
            stop=(),
            eos_ids=b._eos_ids,
            on_token=None,
            cancel=None,
            max_logprobs=b.max_logprobs,  # the raw top logits the backend keeps per token (20 by default)
        )
        spent = [0.0]  # thread CPU seconds inside the hook and the criterion: the scoring work itself

        def hook(module: Any, args: Any, output: Any) -> None:
            t = time.thread_time()
            recorder.hook(module, args, output)
            spent[0] += time.thread_time() - t

        def criterion(input_ids: Any, scores: Any = None, **kwargs: Any) -> Any:
            t = time.thread_time()
            done = recorder(input_ids, scores, **kwargs)
            spent[0] += time.thread_time() - t
            return done

        handle = self.model.register_forward_hook(hook)
        start = time.perf_counter()
        recorder.start = start
        try:
            with torch.inference_mode():
                self.model.generate(
                    **enc,
                    generation_config=cfg,
                    logits_processor=None,
                    stopping_criteria=[criterion, *(extra_criteria or [])],
                )
        finally:
            handle.remove()
        elapsed = time.perf_counter() - start
        self.scoring_cpu.append(spent[0])
        states = [recorder.finish_row(i) for i in range(rows)]
        return elapsed, [[t.id for t in s.tokens] for s in states], states

    def api(self, prompts: list[str], n: int) -> tuple[float, Any, Any]:
        from logtoku_guard.types import DecodingOptions

        start = time.perf_counter()
        gens = self.backend.batch(prompts, DecodingOptions(max_new_tokens=n))
        return time.perf_counter() - start, [[t.id for t in g.tokens] for g in gens], gens


class TensorCensus:
    """A stopping criterion (never stops) that counts live tensors at the first and last step."""

    def __init__(self, last_step: int) -> None:
        self.last_step = last_step
        self.step = 0
        self.first: tuple[int, int] | None = None
        self.last: tuple[int, int] | None = None
        self.last_shapes: list[tuple[int, ...]] = []

    def __call__(self, input_ids: Any, scores: Any = None, **kwargs: Any) -> Any:
        import torch

        self.step += 1
        if self.step in (1, self.last_step):
            count, nbytes, shapes = live_tensors()
            if self.step == 1:
                self.first = (count, nbytes)
            if self.step == self.last_step:
                self.last = (count, nbytes)
                self.last_shapes = shapes
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


# -- sections ---------------------------------------------------------------------------------------
def bench_speed(bench: Bench, n: int, repeats: int, batch_sizes: list[int]) -> list[dict[str, Any]]:
    results = []
    cfg = bench.config(n)
    paths = ("plain", "hook", "api")
    for bs in batch_sizes:
        prompts = bench.prompts(bs)
        enc = bench.encode(prompts)

        def run(path: str, enc: Any = enc, prompts: list[str] = prompts) -> tuple[float, Any]:
            if path == "plain":
                return bench.plain(enc, cfg)
            if path == "hook":
                t, ids, _ = bench.hooked(enc, cfg)
                return t, ids
            t, ids, _ = bench.api(prompts, n)
            return t, ids

        # Warm-up (one of each), also the correctness check: same ids, N per row, on every path.
        ref = None
        mismatches = []
        for path in paths:
            gc.collect()
            _, ids = run(path)
            if any(len(r) != n for r in ids):
                mismatches.append(f"{path}: {[len(r) for r in ids]} tokens per row, expected {n}")
            if ref is None:
                ref = ids
            elif ids != ref:
                mismatches.append(f"{path}: token ids differ from plain")
        times: dict[str, list[float]] = {p: [] for p in paths}
        bench.scoring_cpu.clear()
        cpu: dict[str, list[float]] = {p: [] for p in paths}  # process CPU time, all threads: less hurt by other load
        for r in range(repeats):
            order = paths[r % 3 :] + paths[: r % 3]  # rotate so no path always runs first
            for path in order:
                gc.collect()
                c0 = time.process_time()
                t, _ = run(path)
                cpu[path].append(time.process_time() - c0)
                times[path].append(t)
        entry: dict[str, Any] = {"batch": bs, "tokens": n, "prompt_tokens_padded": int(enc["input_ids"].shape[1])}
        for path in paths:
            ms = [1000 * t / n for t in times[path]]
            entry[path] = {
                "ms_per_step_all": ms,
                "ms_per_step_median": statistics.median(ms),
                "ms_per_step_min": min(ms),
                "ms_per_row_token_median": statistics.median(ms) / bs,
                "spread": (max(ms) - min(ms)) / statistics.median(ms),
                "cpu_ms_per_step_all": [1000 * c / n for c in cpu[path]],
                "cpu_ms_per_step_median": statistics.median(1000 * c / n for c in cpu[path]),
            }
        for path in ("hook", "api"):
            entry[f"{path}_overhead_median"] = entry[path]["ms_per_step_median"] / entry["plain"]["ms_per_step_median"] - 1
            entry[f"{path}_overhead_min"] = entry[path]["ms_per_step_min"] / entry["plain"]["ms_per_step_min"] - 1
            entry[f"{path}_overhead_paired_median"] = statistics.median(s / p - 1 for s, p in zip(times[path], times["plain"]))
            entry[f"{path}_cpu_overhead_median"] = (
                entry[path]["cpu_ms_per_step_median"] / entry["plain"]["cpu_ms_per_step_median"] - 1
            )
            paired = sorted(s / p - 1 for s, p in zip(cpu[path], cpu["plain"]))
            q = statistics.quantiles(paired, n=4) if len(paired) >= 2 else [paired[0]] * 3
            entry[f"{path}_cpu_paired"] = {
                "all": paired,
                "median": statistics.median(paired),
                "q1": q[0],
                "q3": q[2],
                "min": paired[0],
                "max": paired[-1],
            }
        # The scoring work measured directly (thread CPU time inside the hook and the criterion),
        # over the plain step's CPU time: insensitive to other processes, unlike the differences.
        scoring_ms = [1000 * c / n for c in bench.scoring_cpu]
        plain_cpu = entry["plain"]["cpu_ms_per_step_median"]
        entry["scoring_cpu_ms_per_step"] = {
            "median": statistics.median(scoring_ms),
            "min": min(scoring_ms),
            "max": max(scoring_ms),
        }
        entry["scoring_share_of_plain_cpu"] = {k: v / plain_cpu for k, v in entry["scoring_cpu_ms_per_step"].items()}
        entry["check"] = "ok" if not mismatches else "; ".join(mismatches)
        entry["unstable"] = max(entry[p]["spread"] for p in paths) > UNSTABLE_SPREAD
        results.append(entry)
    return results


def bench_memory(bench: Bench, mem_tokens: list[int]) -> dict[str, Any]:
    prompts = bench.prompts(1)
    enc = bench.encode(prompts)
    out: dict[str, Any] = {"batch": 1, "runs": []}
    vocab = bench.backend.vocab_size
    for n in mem_tokens:
        cfg = bench.config(n)
        bench.model.generation_config.min_new_tokens = n  # the api path (see module docstring); restored by main()
        # Tensor census inside generate: plain vs scored (hook + the same census criterion).
        census_plain = TensorCensus(n)
        gc.collect()
        bench.plain(enc, cfg, extra_criteria=[census_plain])
        census_scored = TensorCensus(n)
        gc.collect()
        bench.hooked(enc, cfg, extra_criteria=[census_scored])
        assert census_plain.first and census_plain.last and census_scored.first and census_scored.last
        steps = n - 1
        plain_growth = census_plain.last[1] - census_plain.first[1]
        scored_growth = census_scored.last[1] - census_scored.first[1]
        extra_vocab_tensors = sum(1 for s in census_scored.last_shapes if vocab in s) - sum(
            1 for s in census_plain.last_shapes if vocab in s
        )

        # tracemalloc: Python heap. A traced warm-up first, so lazy one-off caches are not counted.
        tracemalloc.start()
        try:
            bench.api(prompts, n)
            gc.collect()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            _, _ = bench.plain(enc, cfg)
            peak_plain = tracemalloc.get_traced_memory()[1] - base
            gc.collect()
            tensors_before = live_tensors()[:2]
            rss_before = rss_bytes()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            _, _, gens = bench.api(prompts, n)
            peak_scored = tracemalloc.get_traced_memory()[1] - base
            gc.collect()
            with_result = tracemalloc.get_traced_memory()[0]
            gen = gens[0]
            n_tok = len(gen.tokens)
            graph = deep_sizeof(gen)
            holds_tensors = contains_tensor(gen)
            rss_after = rss_bytes()
            tensors_after = live_tensors()[:2]
            # What the result holds = what is freed when it dies (robust to unrelated heap churn).
            del gens, gen
            gc.collect()
            retained = with_result - tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        out["runs"].append(
            {
                "tokens": n_tok,
                "tracemalloc_retained_bytes": retained,
                "tracemalloc_retained_per_token": retained / n_tok,
                "generation_graph_bytes": graph,
                "generation_graph_per_token": graph / n_tok,
                "generation_holds_tensors": holds_tensors,
                "tracemalloc_peak_plain_bytes": peak_plain,
                "tracemalloc_peak_scored_bytes": peak_scored,
                "tracemalloc_peak_extra_bytes": peak_scored - peak_plain,
                "tracemalloc_peak_extra_per_token": (peak_scored - peak_plain) / n_tok,
                "in_generate_tensor_bytes_growth_plain": plain_growth,
                "in_generate_tensor_bytes_growth_scored": scored_growth,
                "in_generate_extra_tensor_bytes_per_step": (scored_growth - plain_growth) / steps,
                "in_generate_tensor_count_last_plain": census_plain.last[0],
                "in_generate_tensor_count_last_scored": census_scored.last[0],
                "in_generate_extra_vocab_sized_tensors_at_last_step": extra_vocab_tensors,
                "live_tensor_bytes_left_by_run": tensors_after[1] - tensors_before[1],
                "live_tensor_count_left_by_run": tensors_after[0] - tensors_before[0],
                "rss_delta_bytes": None if rss_before is None or rss_after is None else rss_after - rss_before,
            }
        )
    small, large = out["runs"]
    out["graph_per_extra_token"] = (large["generation_graph_bytes"] - small["generation_graph_bytes"]) / (
        large["tokens"] - small["tokens"]
    )
    out["retained_per_extra_token"] = (large["tracemalloc_retained_bytes"] - small["tracemalloc_retained_bytes"]) / (
        large["tokens"] - small["tokens"]
    )
    out["no_vocab_sized_tensor_kept"] = all(
        r["in_generate_extra_vocab_sized_tensors_at_last_step"] <= 0
        and r["live_tensor_bytes_left_by_run"] <= 0
        and r["in_generate_extra_tensor_bytes_per_step"] < 4 * vocab
        and not r["generation_holds_tensors"]
        for r in out["runs"]
    )
    return out


def bench_load(skip_cold: bool) -> dict[str, Any]:
    from logtoku_guard.backends.transformers import TransformersBackend

    out: dict[str, Any] = {"cold_s": None, "warm_s": None, "warm_from": None}
    tmp = tempfile.mkdtemp(prefix="ltg-bench-cache-")
    try:
        if not skip_cold:
            gc.collect()
            start = time.perf_counter()
            b = TransformersBackend(cache_dir=tmp)
            out["cold_s"] = time.perf_counter() - start
            del b
            gc.collect()
            out["warm_from"] = "the cache dir just converted"
            cache: str | None = tmp
        else:
            out["warm_from"] = "LOGTOKU_GUARD_CACHE / user cache (already converted)"
            cache = None
        start = time.perf_counter()
        b = TransformersBackend(cache_dir=cache)
        out["warm_s"] = time.perf_counter() - start
        del b
        gc.collect()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# -- report -----------------------------------------------------------------------------------------
def pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def verdict(x: float) -> str:
    if x <= AIM_OVERHEAD:
        return f"meets aim (<= {AIM_OVERHEAD:.1%})"
    if x <= TARGET_OVERHEAD:
        return f"meets target (<= {TARGET_OVERHEAD:.1%})"
    return f"MISSES target (<= {TARGET_OVERHEAD:.1%})"


def kb(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 1024:,.2f} KiB"


def print_memory(mem: dict[str, Any]) -> None:
    print("== 2. memory, batch 1 (scored = backend.batch(); plain = model.generate), target < 1 KB/token")
    hdr = (
        f"{'tokens':>6} {'retained/tok':>13} {'graph/tok':>11} {'peak extra':>12} {'peak xtra/tok':>14} "
        f"{'tensor B/step':>14} {'left tensors':>13} {'RSS delta':>12}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in mem["runs"]:
        print(
            f"{r['tokens']:>6} {kb(r['tracemalloc_retained_per_token']):>13} {kb(r['generation_graph_per_token']):>11} "
            f"{kb(r['tracemalloc_peak_extra_bytes']):>12} {kb(r['tracemalloc_peak_extra_per_token']):>14} "
            f"{r['in_generate_extra_tensor_bytes_per_step']:>14,.0f} {r['live_tensor_bytes_left_by_run']:>13,} "
            f"{kb(r['rss_delta_bytes']):>12}"
        )
    print("  retained/tok: tracemalloc bytes freed when the returned Generation is deleted, / tokens")
    print("  graph/tok:    sys.getsizeof over the Generation object graph, / tokens")
    print("  peak extra:   tracemalloc peak during backend.batch() minus peak during plain generate")
    print("  tensor B/step: growth of live torch tensor bytes from the first to the last step inside generate,")
    print("                scored minus plain, per step (KV-cache growth cancels out); left tensors: bytes after the run")
    print(
        f"  marginal cost from {mem['runs'][0]['tokens']} to {mem['runs'][1]['tokens']} tokens: "
        f"graph {mem['graph_per_extra_token']:,.0f} B/token, tracemalloc-retained {mem['retained_per_extra_token']:,.0f} B/token"
    )
    big = mem["runs"][-1]
    worst = max(
        mem["graph_per_extra_token"],
        mem["retained_per_extra_token"],
        big["generation_graph_per_token"],
        big["tracemalloc_retained_per_token"],
    )
    print(
        f"  per-token memory kept by the result: worst of the marginal costs and the {big['tokens']}-token figures "
        f"= {worst:,.0f} B/token -> "
        + ("meets target (< 1 KB/token)" if worst < TARGET_BYTES_PER_TOKEN else "MISSES target (< 1 KB/token)")
    )
    runs = mem["runs"]
    print(
        "  vocabulary-sized tensors: "
        + (
            "none kept per step (live tensor bytes inside generate grow no faster than plain, "
            f"{runs[0]['in_generate_extra_vocab_sized_tensors_at_last_step']}/"
            f"{runs[1]['in_generate_extra_vocab_sized_tensors_at_last_step']} extra "
            "vocab-sized tensors at the last step, none left after the run, the Generation holds no tensor)"
            if mem["no_vocab_sized_tensor_kept"]
            else "WARNING: tensor memory grows with steps (see figures)"
        )
    )
    print("  RSS delta is informational only: the allocator keeps freed pages, so it is not a per-token figure")


def print_report(report: dict[str, Any]) -> None:
    m = report["machine"]
    print("== machine")
    print(f"platform          {m['platform']} ({m['machine']})")
    print(f"cpu               {m['cpu_model']}; cpu_count={m['cpu_count']} affinity={m['cpu_affinity']}")
    print(f"python / torch    {m['python']} / torch {m['torch']} / transformers {m['transformers']}; cuda={m['cuda']}")
    how = "the backend's default" if report["args"]["threads"] is None else "set by --threads"
    print(f"torch threads     {m['torch_threads']} (interop {m['torch_interop_threads']}; {how})")
    print(f"command           {report['command']}")
    print(f"load average      {report['loadavg_start']} at start, {report['loadavg_end']} at end (1/5/15 min)")
    if report["busy"]:
        print("WARNING           other processes kept the CPU busy (load average above the core count): timings are noisy")
    print(f"model             {report['model']} on {report['device']}, k={report['k']}, vocab={report['vocab']}")
    print(f"model load        {report['first_load_s']:.2f} s (first load in this process, from {report['first_load_from']})")
    print()
    a = report["args"]
    print(f"== 1. time per token, greedy, exactly {a['tokens']} new tokens, {a['repeats']} repeats interleaved after 1 warm-up")
    print("   plain = model.generate; hook = same call + LogTokU hook/criterion;")
    print("   api = backend.batch() (chat template, tokenize, the backend's decode loop with the recorder, build Generation)")
    print("   ms/step = wall time of the whole call (prefill included) / new tokens; one step = one token for every row")
    print("   ovh = scored/plain - 1 (median of each, min of each, median of the per-repeat ratios); spread = (max-min)/median")
    hdr = (
        f"{'batch':>5} {'path':>6} {'ms/step med':>12} {'ms/step min':>12} {'ms/tok/row':>11} "
        f"{'ovh med':>9} {'ovh min':>9} {'ovh paired':>11} {'spread':>7}"
    )
    print(hdr)
    print("-" * len(hdr))
    for e in report["speed"]:
        for path in ("plain", "hook", "api"):
            d = e[path]
            if path == "plain":
                ovh = f"{'':>9} {'':>9} {'':>11}"
            else:
                ovh = (
                    f"{pct(e[path + '_overhead_median']):>9} {pct(e[path + '_overhead_min']):>9} "
                    f"{pct(e[path + '_overhead_paired_median']):>11}"
                )
            print(
                f"{e['batch']:>5} {path:>6} {d['ms_per_step_median']:>12.2f} {d['ms_per_step_min']:>12.2f} "
                f"{d['ms_per_row_token_median']:>11.2f} {ovh} {100 * d['spread']:>6.1f}%"
            )
        print(f"{'':>5} check: {e['check']} (prompt padded to {e['prompt_tokens_padded']} tokens)")
        if e["unstable"]:
            print(
                f"{'':>5} WARNING: repeats spread over {100 * UNSTABLE_SPREAD:.0f}% of the median: the machine was busy "
                "or throttled; rerun before trusting these ratios"
            )
    print(f"ratios (scored/plain - 1), target <= {TARGET_OVERHEAD:.1%} (aim {AIM_OVERHEAD:.1%}):")
    for e in report["speed"]:
        for path in ("hook", "api"):
            print(
                f"  batch {e['batch']:>2} {path:>4}: median {pct(e[path + '_overhead_median'])}, "
                f"min-based {pct(e[path + '_overhead_min'])}, paired median {pct(e[path + '_overhead_paired_median'])}"
                f"  -> {verdict(e[path + '_overhead_median'])} (median)"
                + (" [UNRELIABLE: noisy repeats]" if e["unstable"] else "")
            )
            c = e[path + "_cpu_paired"]
            print(
                f"  {'':>8} {'':>4}  CPU time (all threads): {e[path]['cpu_ms_per_step_median']:.2f} vs "
                f"{e['plain']['cpu_ms_per_step_median']:.2f} ms/step; paired CPU overhead median {pct(c['median'])} "
                f"(IQR {pct(c['q1'])}..{pct(c['q3'])}, min..max {pct(c['min'])}..{pct(c['max'])}) "
                f"-> {verdict(c['median'])}"
            )
    print("scoring work measured directly (thread CPU time inside the hook + criterion per step, hook path),")
    print("as a share of the plain step's CPU time: the overhead without the other processes' noise")
    for e in report["speed"]:
        w, r = e["scoring_cpu_ms_per_step"], e["scoring_share_of_plain_cpu"]
        print(
            f"  batch {e['batch']:>2}: {w['median']:.3f} ms/step (min {w['min']:.3f}, max {w['max']:.3f}) of "
            f"{e['plain']['cpu_ms_per_step_median']:.2f} ms -> {pct(r['median'])} (range {pct(r['min'])}..{pct(r['max'])})"
            f" -> {verdict(r['median'])}"
        )
    print()
    if report["memory"] is None:
        print("== 2. memory: skipped (--skip-memory)")
    else:
        print_memory(report["memory"])
    print()
    load = report["load"]
    print("== 3. load times")
    print(
        "cold load (GGUF -> fresh temp cache dir):  "
        + ("skipped (--skip-cold)" if load["cold_s"] is None else f"{load['cold_s']:.2f} s")
    )
    print(f"warm load (from {load['warm_from']}):  {load['warm_s']:.2f} s")
    print(f"\ntotal benchmark time {report['total_s']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_all = time.perf_counter()
    load_start = loadavg()
    import torch

    from logtoku_guard.backends.embedded import embedded_cache_dir, is_cached
    from logtoku_guard.backends.transformers import TransformersBackend

    was_cached = is_cached(embedded_cache_dir())
    start = time.perf_counter()
    backend = TransformersBackend(threads=args.threads)
    first_load = time.perf_counter() - start
    if backend.threads is not None:  # the same threads on the plain and hook paths as on the api path
        torch.set_num_threads(backend.threads)
    bench = Bench(backend)

    n = args.tokens
    gen_cfg = backend.model.generation_config
    saved_min = gen_cfg.min_new_tokens
    try:
        gen_cfg.min_new_tokens = n  # read by _run through its copy of the model's generation config
        speed = bench_speed(bench, n, args.repeats, args.batch_sizes)
        memory = None if args.skip_memory else bench_memory(bench, args.mem_tokens)
    finally:
        gen_cfg.min_new_tokens = saved_min
    report: dict[str, Any] = {
        "machine": machine_info(),
        "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "args": {
            "tokens": n,
            "repeats": args.repeats,
            "batch_sizes": args.batch_sizes,
            "mem_tokens": args.mem_tokens,
            "skip_cold": args.skip_cold,
            "threads": args.threads,
        },
        "model": backend.model_name,
        "device": str(backend.device),
        "k": backend.k,
        "vocab": backend.vocab_size,
        "first_load_s": first_load,
        "first_load_from": "an already converted cache" if was_cached else "a cache converted now (cold)",
        "targets": {
            "overhead_max": TARGET_OVERHEAD,
            "overhead_aim": AIM_OVERHEAD,
            "bytes_per_token_max": TARGET_BYTES_PER_TOKEN,
        },
        "speed": speed,
        "memory": memory,
    }
    del bench, backend
    gc.collect()
    report["load"] = bench_load(args.skip_cold)
    report["total_s"] = time.perf_counter() - t_all
    report["loadavg_start"] = load_start
    report["loadavg_end"] = loadavg()
    ncpu = os.cpu_count() or 1
    # At start the load is other processes'; at end it includes this one (about torch_threads + 1).
    load_end = report["loadavg_end"]
    start_busy = load_start is not None and float(load_start.split()[0]) > ncpu
    end_busy = load_end is not None and float(load_end.split()[0]) > 2 * ncpu + 1
    report["busy"] = start_busy or end_busy
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
