"""The LangChain examples run as scripts on the embedded model (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
pytestmark = pytest.mark.slow


def actions(row: dict[str, Any]) -> list[str]:
    return [a["action"] for a in row["route"]]  # route: payloads.AttemptPayload items


def run(script: str, *args: str, cache: Path) -> str:
    env = {**os.environ, "LOGTOKU_GUARD_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, env=env, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_rag_guard_example_retrieves_then_abstains(embedded_backend: Any, embedded_cache: Path) -> None:
    rows = [json.loads(line) for line in run("langchain_rag_guard.py", "--json", cache=embedded_cache).splitlines()]
    france, varkess, helvan = rows
    assert france["action"] == "pass" and actions(france) == ["pass"] and "Paris" in france["answer"]
    assert actions(varkess) == ["retrieve", "pass"] and varkess["passages"] >= 1 and "Ulbrecht" in varkess["answer"]
    assert actions(helvan) == ["retrieve"] and helvan["action"] == "abstain"
    assert helvan["answer"] == "I don't know, and my documents do not say."
    assert helvan["reason"].endswith("the retriever returned nothing")
    text = run("langchain_rag_guard.py", cache=embedded_cache)  # the summary names each flagged answer's route
    assert "2 answer(s) flagged by the guard:" in text
    assert "'Who designed the Varkess protocol?': retrieve -> pass => pass" in text
    assert "Helvan engine?': retrieve => abstain" in text


def test_stream_colored_example(embedded_backend: Any, embedded_cache: Path) -> None:
    out = run("langchain_stream_colored.py", "What is the capital of France?", "--max-tokens", "12", cache=embedded_cache)
    assert "\033[" in out and "Paris" in out and "reliability" in out
    plain = run(
        "langchain_stream_colored.py",
        "What is the name of the dog owned by the inventor of the Helvan engine?",
        "--no-color",
        "--guard",
        cache=embedded_cache,
    )
    assert "\033[" not in plain and "[withdrawn:" in plain and "guard: abstain" in plain
