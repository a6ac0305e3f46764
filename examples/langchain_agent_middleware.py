"""An agent with a tool and LogTokUMiddleware: a known question, an invented entity, a human review.

Run: python examples/langchain_agent_middleware.py   (the embedded SmolLM2-135M, on CPU)

1. A question the model knows passes (route ['pass']).
2. A question about an invented entity is routed: its guard score falls among the 30% least
   reliable answers of the model's profile (shipped for the embedded model), so context is
   retrieved and the model answers again (route ['retrieve', ...]); only the final answer
   enters the agent state.
3. With a review policy the agent pauses (interrupt) with the draft; a reviewer resumes it
   with an edit.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from langchain.agents import create_agent
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langchain_logtoku import ChatLogTokU, LogTokUMiddleware
from logtoku_guard import AuditStore, Policy

CORPUS = ["The Zarnovian Institute of Quantum Botany was founded in 1987 by Dr. Elena Marwick."]


@tool
def directory(name: str) -> str:
    """Look a person up in the staff directory."""
    return f"{name}: no entry"


def retriever(query: str) -> list[str]:
    words = {w.strip("?.,") for w in query.split() if w[:1].isupper()}
    return [p for p in CORPUS if words & set(p.split())]


def rule(action: str, stat: str, below: object) -> dict[str, object]:
    return {"name": "unsure", "when": {"stat": stat, "op": "<", "value": below}, "action": action}


def main() -> None:
    model = ChatLogTokU(max_tokens=40, logtoku_profile=None)
    # Thresholds from the model's own profile: AU/EU and the guard score live on each model's scale.
    unsure = rule("retrieve", "guard_score", {"quantile": 0.3})
    routed = Policy.from_dict({"name": "demo", "rules": [unsure], "retrieve": {"fallback": "warn"}})
    agent = create_agent(model, tools=[directory], middleware=[LogTokUMiddleware(policy=routed, retriever=retriever)])
    for question in ("What is the capital of France?", "Who founded the Zarnovian Institute of Quantum Botany?"):
        last = agent.invoke({"messages": [("user", question)]})["messages"][-1]
        decision = last.response_metadata["logtoku_guard"]
        print(f"Q: {question}\nA: {last.content}\n   route: {[a['action'] for a in decision['route']]}\n")

    store = AuditStore(Path(tempfile.mkdtemp()) / "audit.db")
    review = Policy.from_dict(
        {"name": "review", "rules": [rule("human_review", "reliability", 0.0)]}
    )  # every answer, for the demo
    agent = create_agent(
        model, tools=[directory], middleware=[LogTokUMiddleware(policy=review, store=store)], checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "demo"}}
    out = agent.invoke({"messages": [("user", "Who founded the Zarnovian Institute of Quantum Botany?")]}, config)
    request = out["__interrupt__"][0].value
    print(f"review #{request['review_id']}: draft {request['draft']!r} ({request['decision']['reason']})")
    out = agent.invoke(Command(resume={"type": "edit", "answer": "Dr. Elena Marwick, in 1987."}), config)
    print(f"after the edit: {out['messages'][-1].content}")


if __name__ == "__main__":
    main()
