"""One client can never hurt another: a request whose grammar fails fails alone, through the real server.

The attacker is a tool call whose grammar fails mid-decoding the way an exploding schema does
(llguidance's "Too many items" limit at a step's mask, injected at its third step: a schema that
really explodes is now refused at validation, see the last test). It runs in the same continuous
batch as victim requests, on both backends: the attacker gets a 400 naming its own constraint; each
victim gets a 200 whose answer equals its answer alone, bit for bit, and no byte of the attacker's
request (its tool's name) reaches a victim.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")

from support.served import llamacpp_served, tiny_served  # noqa: E402

from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402
from logtoku_guard.tools import grammar  # noqa: E402
from logtoku_guard.tools.constraints import ToolCalls  # noqa: E402

ATTACKER = {
    "type": "function",
    "function": {
        "name": "zz_attacker_tool",
        "parameters": {"type": "object", "properties": {"zz_secret_param": {"type": "string"}}, "required": ["zz_secret_param"]},
    },
}
VICTIMS = ["What is the capital of France?", "Name three colours.", "Count from one to five."]


@pytest.fixture
def exploding_grammar(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacker's grammar fails at its third mask, as a parse that exceeds llguidance's item limit does."""
    real_fill = grammar.RowGrammar.fill
    steps: dict[int, int] = {}

    def fill(self: grammar.RowGrammar, bitmask: Any) -> None:
        real_fill(self, bitmask)
        if isinstance(self.constraint, ToolCalls) and "zz_attacker_tool" in self.constraint.names:
            steps[id(self)] = steps.get(id(self), 0) + 1
            if steps[id(self)] >= 3:
                self.failure = "parser error: Too many items (limit 50000); zz_attacker_tool"
                (bitmask[None, :] if bitmask.ndim == 1 else bitmask)[:] = -1

    monkeypatch.setattr(grammar.RowGrammar, "fill", fill)


@pytest.mark.parametrize("kind", ["transformers", pytest.param("llamacpp", marks=pytest.mark.slow)])  # the real GGUF: slow
def test_an_attacker_row_fails_alone_and_the_victims_answer_as_alone(
    kind: str, tiny_tokenizer: Any, exploding_grammar: None
) -> None:
    backend = tiny_served(tiny_tokenizer) if kind == "transformers" else llamacpp_served()
    body = {"max_tokens": 24, "temperature": 0}
    with BackgroundServer(build_app(backend)) as srv:
        url = srv.base_url + "/chat/completions"
        alone = [
            httpx.post(url, json={**body, "messages": [{"role": "user", "content": q}]}, timeout=120).json() for q in VICTIMS
        ]
        results: dict[str, Any] = {}

        def send(name: str, payload: dict[str, Any]) -> None:
            results[name] = httpx.post(url, json=payload, timeout=120)

        threads = [
            threading.Thread(target=send, args=(q, {**body, "messages": [{"role": "user", "content": q}]})) for q in VICTIMS
        ]
        attack = {
            **body,
            "max_tokens": 40,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [ATTACKER],
            "tool_choice": "required",
        }
        threads.append(threading.Thread(target=send, args=("attacker", attack)))
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(120)
    if kind == "transformers":
        assert backend._batcher.largest >= 2  # the attacker shared a batch with victims
    attacker = results["attacker"]
    assert attacker.status_code == 400, attacker.text
    assert "constraint failed while decoding" in attacker.json()["error"]["message"]
    for q, solo in zip(VICTIMS, alone):
        r = results[q]
        assert r.status_code == 200, r.text
        assert b"zz_attacker_tool" not in r.content and b"zz_secret_param" not in r.content
        assert r.json()["choices"][0]["message"]["content"] == solo["choices"][0]["message"]["content"]
    getattr(backend, "close", lambda: None)()  # the llama.cpp context is freed now


def test_a_schema_that_cannot_be_bounded_is_refused_before_decoding(tiny_tokenizer: Any) -> None:
    """The issue's F1 body: a required, recursive $ref (no finite JSON satisfies it)."""
    recursive = {
        "type": "function",
        "function": {
            "name": "t",
            "parameters": {
                "type": "object",
                "properties": {"child": {"$ref": "#"}, "v": {"type": "integer"}},
                "required": ["child"],
            },
        },
    }
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "tools": [recursive], "tool_choice": "required"}
    with BackgroundServer(build_app(tiny_served(tiny_tokenizer))) as srv:
        r = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60)
        ok = httpx.post(srv.base_url + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert r.status_code == 400 and "recursive" in r.json()["error"]["message"] and r.json()["error"]["param"] == "tools"
    assert ok.status_code == 200
