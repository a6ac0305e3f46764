"""How much code one ``LogTokUGuard.invoke`` runs through: source files touched and message conversions.

Run: ``.venv/bin/python benchmarks/bench_langchain_invoke.py`` (scripted backend, no model; a
second of work). Prints, for one guarded ``invoke`` that retrieves once (two generations), the
number of distinct source files whose functions ran (``sys.setprofile``), split by package
(``logtoku_guard``, ``langchain_logtoku``, ``langchain_core``), and how many times messages were
converted between LangChain and the core. The first ``invoke`` warms imports and caches; the
second is the one measured.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from files_run import PACKAGES, FilesRun  # benchmarks/files_run.py: the profiler both benchmarks share

from langchain_logtoku import ChatLogTokU, LogTokUGuard, _convert
from logtoku_guard import Policy, ScriptedAnswer, ScriptedBackend

UNSURE = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])
SURE = ScriptedAnswer(["Elena", " Marwick", "."], [[9.0, 0.1], [8.0, 0.2], [9.5, 0.3]])
UNSURE_RULE = {"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": "retrieve"}
POLICY = Policy.from_dict({"name": "bench", "rules": [UNSURE_RULE]})


def answer_for(messages: list[Any]) -> ScriptedAnswer:
    return SURE if "Context:" in messages[-1].content else UNSURE


def measure() -> tuple[Counter[str], Counter[str]]:
    backend = ScriptedBackend(answer_for, model_name="bench")
    llm = ChatLogTokU(backend=backend, cache=False)
    guard = LogTokUGuard(llm=llm, policy=POLICY, retriever=lambda q: ["Elena Marwick founded it."])
    guard.invoke("Who founded the Zarnovian Institute?")  # warm
    conversions: Counter[str] = Counter()
    watched = {"to_core_messages": "LangChain -> core", "to_langchain_messages": "core -> LangChain"}
    originals = {name: getattr(_convert, name) for name in watched}

    def counting(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            conversions[watched[name]] += 1
            return originals[name](*args, **kwargs)

        return call

    for name in watched:
        setattr(_convert, name, counting(name))
    for module in list(sys.modules.values()):  # the adapters imported the converters by name
        for name in watched:
            if getattr(module, name, None) is originals[name] and module is not _convert:
                setattr(module, name, counting(name))

    files = FilesRun()
    files.install()
    try:
        with files.recording():
            guard.invoke("Who founded the Zarnovian Institute?")
    finally:
        files.uninstall()
    return files.by_package(), conversions


def main() -> None:
    by_package, conversions = measure()
    print("one LogTokUGuard.invoke (retrieve once: two generations), distinct source files run:")
    for package in PACKAGES:
        print(f"  {package:<18} {by_package[package]:>4}")
    print(f"  {'total':<18} {sum(by_package.values()):>4}")
    print("message conversions:", dict(conversions) or "none")


if __name__ == "__main__":
    main()
