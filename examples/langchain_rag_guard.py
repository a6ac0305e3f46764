"""Adaptive RAG with LangChain: retrieve only when the model is unsure, abstain when nothing helps.

The chain is ``prompt | guard``: the embedded SmolLM2-135M-Instruct answers from its own
knowledge first; :class:`~langchain_logtoku.LogTokUGuard` reads the answer's token
uncertainty (LogTokU AU/EU) and

- passes a reliable answer ("What is the capital of France?");
- sends an unreliable one to the retriever over a small in-memory corpus and answers again
  with the passages found ("Who designed the Varkess protocol?", a made-up fact that is in
  the corpus);
- abstains when the retriever has nothing for it ("... the inventor of the Helvan engine?",
  in neither the model nor the corpus).

The thresholds are absolute numbers for the embedded model (its calibration profile puts
reliability -0.038 at about its 65th percentile and max EU 0.12 at about its 53rd): AU/EU live on
each model's own logit scale, so re-fit them for another model (``logtoku-guard calibrate``,
then ``{quantile: q}`` thresholds). A 135M model knows little and its uncertainty signal is
weak; the questions were chosen to show each route, not as a benchmark.

Run: ``python examples/langchain_rag_guard.py`` (``--json`` prints one JSON object per
question). Needs langchain-logtoku (``pip install ./integrations/langchain``; scripts/install.sh installs it).
"""

from __future__ import annotations

import argparse
import json
import re

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever

from langchain_logtoku import ChatLogTokU, FlaggedAnswerHandler, LogTokUGuard
from logtoku_guard import Policy

CORPUS = [
    "The Zarnovian Institute of Quantum Botany was founded in 1987 by Dr. Elena Marwick in Tallinn, Estonia.",
    "Glimmerfen is a small island village in the North Sea. Its blue-roofed lighthouse was built in 1902.",
    "The Varkess protocol is a data format for sensor logs, designed by the engineer Tomas Ulbrecht in 2011.",
    "Ulbrecht later led the team that standardised Varkess version 2 in 2016.",
]

QUESTIONS = [
    "What is the capital of France?",
    "Who designed the Varkess protocol?",
    "What is the name of the dog owned by the inventor of the Helvan engine?",
]

POLICY = Policy.from_dict(
    {
        "name": "adaptive-rag",
        "version": "1",
        "rules": [
            {
                "name": "unsure",
                "when": {
                    "any": [
                        {"stat": "reliability", "op": "<", "value": -0.038},
                        {"stat": "max_eu", "op": ">", "value": 0.12},
                    ]
                },
                "action": "retrieve",
                "reason": "the model is unsure of its own answer",
            }
        ],
        "default_action": "pass",
        "retrieve": {"max_attempts": 1, "fallback": "abstain", "passages": 2},
        "abstain": {"message": "I don't know, and my documents do not say."},
    }
)

_STOP = frozenset(
    "a an and are as at by did do does for from has have how in is it its of on or the to was were what when where which "  # noqa: SIM905
    "who whom whose why with name owned".split()
)


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if w not in _STOP}


class KeywordRetriever(BaseRetriever):
    """Documents sharing at least one content word with the query, most shared words first."""

    documents: list[Document]
    k: int = 2

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        q = _words(query)
        scored = [(len(q & _words(d.page_content)), i) for i, d in enumerate(self.documents)]
        return [self.documents[i] for n, i in sorted(scored, key=lambda s: (-s[0], s[1])) if n > 0][: self.k]


def build_chain(llm: ChatLogTokU | None = None) -> tuple[object, FlaggedAnswerHandler]:
    llm = llm or ChatLogTokU(max_tokens=40)
    retriever = KeywordRetriever(documents=[Document(page_content=t) for t in CORPUS])
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a helpful assistant. Answer in one short sentence."), ("human", "{question}")]
    )
    guard = LogTokUGuard(llm=llm, policy=POLICY, retriever=retriever)
    return prompt | guard, FlaggedAnswerHandler(log_level=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per question")
    args = parser.parse_args()
    chain, flagged = build_chain()
    for question in QUESTIONS:
        answer = chain.invoke({"question": question}, config={"callbacks": [flagged], "tags": ["example"]})
        d = answer.response_metadata["logtoku_guard"]
        if args.json:
            keys = ("action", "route", "rule", "reason", "reliability", "attempts", "passages", "draft")
            print(json.dumps({"question": question, "answer": answer.content, **{k: d[k] for k in keys}}))
        else:
            print(f"Q: {question}")
            route = " -> ".join(a["action"] for a in d["route"])
            print(f"   route: {route} => {d['action']}   reliability {d['reliability']:.4f}")
            print(f"   why: {d['reason']}")
            if d["draft"] != answer.content:
                print(f"   model said: {d['draft']!r}")
            print(f"A: {answer.content}\n")
    if not args.json:  # flagged = not simply passed: retrieved (then passed or abstained), warned, abstained...
        print(f"{len(flagged.flagged)} answer(s) flagged by the guard:")
        for f in flagged.flagged:
            print(f"   {f.question!r}: {' -> '.join(a['action'] for a in f.decision['route'])} => {f.action}")


if __name__ == "__main__":
    main()
