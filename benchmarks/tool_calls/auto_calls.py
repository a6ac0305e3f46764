#!/usr/bin/env python
"""Tool calls started under ``tool_choice="auto"`` on the embedded model: prompts that need a tool vs prompts that do not.

For each prompt, ``ChatLogTokU(...).bind_tools(TOOLS)`` (``"auto"``: the model may answer in
prose; a call it opens is decoded under the grammar) is invoked greedily, and two figures are
printed, measured, never asserted:

1. the share of answers that start a tool call (a ``<tool_call>`` block: a parsed call or an
   invalid one), for the 10 prompts that need one of the tools and the 10 that need none;
2. the model's own probability of opening a call as its first token (``p(<)``, the first token
   of ``<tool_call>``, read from the raw logits after the same system turn and question), its
   median and its rank among all tokens: how far greedy decoding is from starting a call.

    LOGTOKU_GUARD_CACHE=/tmp/ltg-cache python benchmarks/tool_calls/auto_calls.py

Needs the ``tools`` and ``langchain`` extras.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = [
    _tool("get_weather", "Get the current weather at a location.", {"location": {"type": "string"}}),
    _tool("transfer", "Send money to a person.", {"amount": {"type": "number"}, "to": {"type": "string"}}),
    _tool("search_web", "Search the web for recent information.", {"query": {"type": "string"}}),
    _tool("multiply", "Multiply two integers.", {"a": {"type": "integer"}, "b": {"type": "integer"}}),
]
NEED = [
    "What is the weather in San Francisco, CA?",
    "Is it raining in London right now?",
    "Send 25 dollars to Alice.",
    "Please transfer 100 euros to Bob.",
    "Search the web for the latest news about the Mars rover.",
    "Find recent articles about electric cars.",
    "What is 3 times 12?",
    "Multiply 7 by 8.",
    "How hot is it in Tokyo today?",
    "Pay Carol 40 dollars.",
]
NO_NEED = [
    "What is the capital of France?",
    "Tell me a joke about cats.",
    "Hello! How are you?",
    "Write a haiku about the sea.",
    "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.",
    "What is the color of the sky?",
    "Give me a synonym for happy.",
    "Thank you for your help!",
    "What does a bee make?",
]


def _open_probability(chat: Any, question: str) -> tuple[float, int]:
    """``p(<)`` as the answer's first token and its rank, after the prompt ``chat`` builds for ``question``."""
    import torch
    from langchain_core.messages import HumanMessage

    backend = chat.core_backend
    call = chat._call(None, {"tools": TOOLS})
    turns = [{"role": m.role, "content": m.content} for m in chat._prompt([HumanMessage(question)], call)]
    ids = backend.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=False)
    first = backend.tokenizer("<tool_call>", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        logits = backend.model(torch.tensor([list(ids)], device=backend.device)).logits[0, -1].float()
    logp = logits.log_softmax(-1)
    return float(logp[first].exp()), int((logp > logp[first]).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", default=None, help="the converted-model cache (default: LOGTOKU_GUARD_CACHE)")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens at most per answer")
    args = parser.parse_args()

    from langchain_logtoku import ChatLogTokU

    chat = ChatLogTokU(cache_dir=args.cache_dir, device="cpu", max_tokens=args.tokens, logtoku_profile=None)
    bound = chat.bind_tools(TOOLS)
    for label, questions in (("need a tool", NEED), ("need none", NO_NEED)):
        started, probabilities, ranks = 0, [], []
        for question in questions:
            message = bound.invoke(question)
            opened = bool(message.tool_calls or message.invalid_tool_calls)
            started += opened
            p, rank = _open_probability(chat, question)
            probabilities.append(p)
            ranks.append(rank)
            shown = message.tool_calls[0] if message.tool_calls else message.content
            print(f"  [{label}] {question!r}: {'CALL' if opened else 'prose'} p(<)={p:.3f} rank={rank} {str(shown)[:70]!r}")
        print(
            f"{label}: calls started {started}/{len(questions)}; p(<) median {statistics.median(probabilities):.3f} "
            f"(max {max(probabilities):.3f}); rank median {statistics.median(ranks)}"
        )


if __name__ == "__main__":
    main()
