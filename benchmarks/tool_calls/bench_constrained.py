#!/usr/bin/env python
"""Constrained tool calls on the embedded model: cost per token, and valid calls vs the prompt-only way.

Same tool prompt (the JSON tool-call prompt of ``langchain_logtoku.tools``), greedy, the
backend's public ``generate`` (every token scored), runs interleaved (free, constrained,
free...) over ``--repeats`` rounds of the prompts. Measured, never asserted:

1. cost per token: wall time of the calls / generated tokens, free (no constraint: the model
   answers as it likes) vs constrained (``DecodingOptions(constraint=ToolCalls(tools,
   "required"))``), and their ratio; plus the grammar's own share: the time spent computing
   and applying the masks (``DecodeLoop._mask``, timed in place) per constrained token;
2. valid calls: the share of answers that hold at least one well-formed call of a bound tool
   with its required arguments and nothing malformed (``parse_tool_calls``), prompt-only vs
   constrained, and how many answers ``--tokens`` cut (a constrained answer is a valid call
   whenever it ends before the limit; the grammar fixes the form, not the length of a string).
   The first round prints each answer and, constrained, each argument's scores.

    python benchmarks/tool_calls/bench_constrained.py --cache-dir /tmp/ltg-cache

Needs the ``tools`` and ``langchain`` extras (the prompt and parser). The load average is
printed: other processes move the timings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "transfer",
            "description": "Send an amount of money to a person.",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "number"}, "to": {"type": "string"}},
                "required": ["amount", "to"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
]
PROMPTS = [
    "What is the weather in Paris?",
    "Send 25 dollars to Alice.",
    "Search for the tallest building in the world.",
    "Is it raining in Tokyo right now?",
    "Pay Bob 10 euros.",
    "Find recent news about the Mars rover.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=os.environ.get("LOGTOKU_GUARD_CACHE"))
    parser.add_argument("--tokens", type=int, default=96, help="max new tokens per answer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from langchain_logtoku import tools as lc_tools
    from logtoku_guard.backends import decode_loop
    from logtoku_guard.backends.transformers import TransformersBackend
    from logtoku_guard.scoring.tool_scores import score_tool_calls
    from logtoku_guard.tools.constraints import ToolCalls
    from logtoku_guard.types import ChatMessage, DecodingOptions

    backend = TransformersBackend(cache_dir=args.cache_dir, device="cpu", threads=args.threads)
    mask_s = [0.0]
    original = decode_loop.DecodeLoop._mask

    def timed(self: Any, scores: Any) -> Any:
        start = time.perf_counter()
        out = original(self, scores)
        mask_s[0] += time.perf_counter() - start
        return out

    decode_loop.DecodeLoop._mask = timed  # type: ignore[method-assign]
    system = lc_tools.tool_prompt(TOOLS, "any")
    names = lc_tools.names(TOOLS)
    required = {t["function"]["name"]: set(t["function"]["parameters"]["required"]) for t in TOOLS}
    free = DecodingOptions(max_new_tokens=args.tokens)
    constrained = free.replace(constraint=ToolCalls(TOOLS, "required"))
    backend.grammar_engine()  # built once (~0.3 s), outside the timings
    backend.generate("warm up", free)

    def valid(text: str) -> bool:
        _, calls, invalid = lc_tools.parse_tool_calls(text, names)
        return bool(calls) and not invalid and all(required[c["name"]] <= set(c["args"]) for c in calls)

    runs: dict[str, dict[str, list[float]]] = {
        m: {"s": [], "tokens": [], "valid": [], "cut": []} for m in ("free", "constrained")
    }
    for round_ in range(args.repeats):
        for prompt in PROMPTS:
            messages = [ChatMessage("system", system or ""), ChatMessage("user", prompt)]
            for mode, options in (("free", free), ("constrained", constrained)):
                start = time.perf_counter()
                g = backend.generate(messages, options)
                runs[mode]["s"].append(time.perf_counter() - start - (g.timings.first_token_s or 0.0))
                runs[mode]["tokens"].append(max(len(g.tokens) - 1, 1))
                runs[mode]["valid"].append(float(valid(g.text)))
                runs[mode]["cut"].append(float(g.finish_reason == "length"))
                if round_ == 0:
                    print(f"[{mode:11}] {prompt!r} -> {g.text!r}")
                    for call in score_tool_calls(g.tokens) if mode == "constrained" else ():
                        for name, a in (call.arguments if call is not None else {}).items():
                            print(f"              {name}: {a.tokens} tokens, max EU {a.max_eu:.3f}, log p {a.logprob:.2f}")

    per_token = {m: sum(r["s"]) / sum(r["tokens"]) for m, r in runs.items()}
    ratio = per_token["constrained"] / per_token["free"]
    mask_per_token = mask_s[0] / sum(runs["constrained"]["tokens"])
    print(f"\nload average: {os.getloadavg()}; threads={args.threads}; {args.repeats} rounds x {len(PROMPTS)} prompts")
    for mode, r in runs.items():
        print(
            f"{mode:11}: {1000 * per_token[mode]:.2f} ms/token (decode, first token excluded; "
            f"median answer {statistics.median(r['tokens']):.0f} tokens), valid calls {sum(r['valid']):.0f}/{len(r['valid'])} "
            f"({100 * statistics.fmean(r['valid']):.0f}%), cut by --tokens {sum(r['cut']):.0f}"
        )
    print(f"constrained / free per token: {ratio:.3f} ({100 * (ratio - 1):+.1f}%)")
    print(
        f"grammar mask alone: {1e6 * mask_per_token:.0f} us/token "
        f"({100 * mask_per_token / per_token['free']:.1f}% of a free token's time)"
    )


if __name__ == "__main__":
    main()
