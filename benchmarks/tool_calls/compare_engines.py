#!/usr/bin/env python
"""The grammar engines compared on the embedded SmolLM2-135M vocabulary (49,152 tokens).

For llguidance, outlines-core and xgrammar (whichever are importable): the time to read the
tokenizer, to compile one tool-call JSON schema, and the per-token mask cost (fill the
next-token bitmask, then advance by the token) along the tokens of one call; the second pass
over the call is timed (the first warms lazily built tables). Each engine's own mask is
checked to allow every token of the call. Only llguidance is a project dependency (the
``tools`` extra); the others are measured for the choice:

    pip install --target /tmp/engines --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 outlines-core==0.2.14
    PYTHONPATH=/tmp/engines python benchmarks/tool_calls/compare_engines.py --cache-dir /tmp/ltg-cache

(xgrammar 0.2.8 also declares triton as a dependency, not needed on CPU: hence ``--no-deps``.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"enum": ["c", "f"]}},
            "required": ["city", "days", "units"],
        },
    },
    "required": ["name", "arguments"],
}
CALL = {"name": "get_weather", "arguments": {"city": 'Paris, "France" é', "days": 3, "units": "c"}}


def _allowed(words: Any, token: int) -> bool:
    return bool((int(words[token // 32]) >> (token % 32)) & 1)


def _time(ids: list[int], fill: Callable[[], Any], advance: Callable[[int], Any]) -> list[float]:
    out = []
    for token in ids:
        start = time.perf_counter()
        words = fill()
        out.append(time.perf_counter() - start)
        if not _allowed(words, token):
            msg = f"the engine's mask refused token {token} of the call"
            raise RuntimeError(msg)
        advance(token)
    return out


def llguidance_run(tok: Any, vocab: int, ids: list[int]) -> tuple[float, float, list[float]]:
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    t0 = time.perf_counter()
    lt = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    t1 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        SCHEMA, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    )
    llguidance.LLMatcher(lt, grammar)
    t2 = time.perf_counter()
    mask = llguidance.numpy.allocate_token_bitmask(1, vocab)
    times: list[float] = []
    for _ in range(2):
        m = llguidance.LLMatcher(lt, grammar)
        times = _time(ids, lambda m=m: (llguidance.numpy.fill_next_token_bitmask(m, mask), mask[0])[1], m.consume_token)
    return t1 - t0, t2 - t1, times


def outlines_run(tok: Any, vocab: int, ids: list[int]) -> tuple[float, float, list[float]]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema
    from outlines_core.kernels.torch import allocate_token_bitmask, fill_next_token_bitmask
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    t0 = time.perf_counter()
    byte_of = {v: k for k, v in bytes_to_unicode().items()}  # byte-level BPE token text -> bytes
    tokens: dict[Any, list[int]] = {}
    for text, i in tok.get_vocab().items():
        if i != tok.eos_token_id:
            key = bytes(byte_of[c] for c in text) if all(c in byte_of for c in text) else text.encode()
            tokens.setdefault(key, []).append(i)
    voc = Vocabulary(tok.eos_token_id, tokens)
    t1 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA), r" ?"), voc)
    t2 = time.perf_counter()
    mask = allocate_token_bitmask(vocab)
    times: list[float] = []
    for _ in range(2):
        g = Guide(index)
        times = _time(ids, lambda g=g: (fill_next_token_bitmask(g, mask), mask[0])[1], g.advance)
    return t1 - t0, t2 - t1, times


def xgrammar_run(tok: Any, vocab: int, ids: list[int]) -> tuple[float, float, list[float]]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab))
    t1 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    t2 = time.perf_counter()
    mask = xgr.allocate_token_bitmask(1, vocab)
    times: list[float] = []
    for _ in range(2):
        m = xgr.GrammarMatcher(compiled)
        times = _time(ids, lambda m=m: (m.fill_next_token_bitmask(mask), mask[0])[1], m.accept_token)
    return t1 - t0, t2 - t1, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from logtoku_guard.backends.embedded import embedded_cache_dir

    tok = AutoTokenizer.from_pretrained(embedded_cache_dir(args.cache_dir))  # the converted embedded model
    vocab = len(tok)
    ids = tok(json.dumps(CALL, ensure_ascii=False), add_special_tokens=False)["input_ids"]
    print(f"vocabulary {vocab} tokens; the call is {len(ids)} tokens")
    for name, run in (("llguidance", llguidance_run), ("outlines-core", outlines_run), ("xgrammar", xgrammar_run)):
        try:
            tokenizer_s, compile_s, times = run(tok, vocab, ids)
        except ImportError as exc:
            print(f"{name:13}: not installed ({exc.name})")
            continue
        us = [1e6 * t for t in times]
        print(
            f"{name:13}: tokenizer {tokenizer_s:.3f} s, compile {1000 * compile_s:.1f} ms, "
            f"mask per token mean {statistics.fmean(us):.1f} us, median {statistics.median(us):.1f} us, max {max(us):.1f} us"
        )


if __name__ == "__main__":
    main()
