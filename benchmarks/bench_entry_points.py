"""What one call builds and touches, per entry point: guards and deciders built, and source files run.

Run: ``.venv/bin/python benchmarks/bench_entry_points.py`` (scripted backend, no model; seconds).
For a LangChain ``LogTokUGuard.invoke`` and a served ``/v1/chat/completions`` (the ASGI app driven
in-process by Starlette's test client, a policy that passes), each measured on its second call
(the first warms imports and caches): how many ``Guard`` and ``Decider`` objects the call built,
and the distinct source files of ``logtoku_guard``, ``langchain_logtoku`` and ``langchain_core``
whose functions ran (``sys.setprofile`` / ``threading.setprofile``: the server generates in worker
threads). To compare with an older commit, run it with that checkout first on ``PYTHONPATH``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from files_run import PACKAGES, FilesRun  # benchmarks/files_run.py: the profiler both benchmarks share

from logtoku_guard import Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.decision import decider as decider_module
from logtoku_guard.guard import guard as guard_module

SURE = ScriptedAnswer(["Elena", " Marwick", "."], [[9.0, 0.1], [8.0, 0.2], [9.5, 0.3]])
NEVER = {"name": "never", "when": {"stat": "max_eu", "op": ">", "value": 2.0}, "action": "abstain"}
POLICY = Policy.from_dict({"name": "bench", "rules": [NEVER]})


@contextmanager
def counted(cls: type, into: Counter[str]) -> Iterator[None]:
    real = cls.__init__

    def counting(obj: Any, *args: Any, **kwargs: Any) -> None:
        into[cls.__name__] += 1
        real(obj, *args, **kwargs)

    cls.__init__ = counting  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__init__ = real  # type: ignore[method-assign]


FILES = FilesRun()


def measure(call: Callable[[], Any]) -> tuple[Counter[str], Counter[str]]:
    """Files by package and objects built during ``call()``, in every thread started after :func:`main`
    installed the profiler (the server's event-loop and worker threads included)."""
    built: Counter[str] = Counter()
    with counted(guard_module.Guard, built), counted(decider_module.Decider, built), FILES.recording():
        call()
    return FILES.by_package(), built


def langchain_invoke() -> Callable[[], Any]:
    from langchain_logtoku import ChatLogTokU, LogTokUGuard

    llm = ChatLogTokU(backend=ScriptedBackend(lambda _m: SURE, model_name="bench"), cache=False)
    guard = LogTokUGuard(llm=llm, policy=POLICY, profile=None)
    guard.invoke("Who founded the Zarnovian Institute?")  # warm
    return lambda: guard.invoke("Who founded the Zarnovian Institute?")


def chat_completion() -> Callable[[], Any]:
    from fastapi.testclient import TestClient

    from logtoku_guard.server import build_app

    client = TestClient(build_app(ScriptedBackend(lambda _m: SURE, model_name="bench"), policy=POLICY))
    client.__enter__()
    body = {"messages": [{"role": "user", "content": "Who founded it?"}], "max_tokens": 3, "temperature": 0}

    def post() -> None:
        r = client.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            msg = f"chat completion failed: {r.status_code} {r.text[:200]}"
            raise RuntimeError(msg)

    post()  # warm
    return post


def main() -> None:
    FILES.install(threads=True)  # before any thread of the measured calls starts
    for name, make in (("LogTokUGuard.invoke", langchain_invoke), ("/v1/chat/completions", chat_completion)):
        by_package, built = measure(make())
        files = ", ".join(f"{p} {by_package[p]}" for p in PACKAGES if by_package[p])
        print(
            f"{name:<22} built: Guard {built['Guard']}, Decider {built['Decider']}; files run: {files} "
            f"(total {sum(by_package.values())})"
        )


if __name__ == "__main__":
    main()
