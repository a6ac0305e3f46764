"""Stream a LangChain chat model token by token, each token coloured by its LogTokU uncertainty.

Every streamed chunk of :class:`~langchain_logtoku.ChatLogTokU` carries its own token's scores
in ``response_metadata["logtoku"]["tokens"]``; the last chunk carries the summary. Colours:

- with a calibration profile (``logtoku-guard calibrate``; loaded automatically), the token's
  quadrant: I red (no idea), II yellow (one guess, no knowledge), III green (sure), IV cyan
  (several good options);
- without one, EU alone: red when EU is above ``--eu-threshold`` (default 0.0436, the median
  token EU of the embedded model), else green.

``--guard`` streams through :class:`~langchain_logtoku.LogTokUGuard` in ``retract`` mode: the
tokens appear as generated, and if the guard then withdraws the answer (custom event
``logtoku_retracted``) the replacement follows a ``[withdrawn]`` mark.

Run: ``python examples/langchain_stream_colored.py "Who wrote Hamlet?"`` (``--no-color`` for
plain text with the quadrant after each token). Needs langchain-logtoku
(``pip install ./integrations/langchain``; scripts/install.sh installs it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler

from langchain_logtoku import RETRACTED_EVENT, ChatLogTokU, LogTokUGuard
from logtoku_guard import Policy

COLORS = {"I": "\033[31m", "II": "\033[33m", "III": "\033[32m", "IV": "\033[36m", "high": "\033[31m", "low": "\033[32m"}
RESET = "\033[0m"


class RetractionWatcher(BaseCallbackHandler):
    """Remembers whether the guard withdrew what was streamed."""

    def __init__(self) -> None:
        self.retracted: dict[str, Any] | None = None

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == RETRACTED_EVENT:
            self.retracted = data


def label(item: dict[str, Any], eu_threshold: float) -> str:
    if item["quadrant"] is not None:
        return str(item["quadrant"])
    return "high" if item["eu"] is not None and item["eu"] > eu_threshold else "low"


def show(text: str, tag: str, color: bool) -> str:
    return f"{COLORS[tag]}{text}{RESET}" if color else f"{text}[{tag}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="Who wrote the play Hamlet?")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--eu-threshold", type=float, default=0.0436)
    parser.add_argument("--no-color", action="store_true")
    parser.add_argument("--guard", action="store_true", help="stream through LogTokUGuard in retract mode")
    args = parser.parse_args(argv)
    color = not args.no_color
    llm = ChatLogTokU(max_tokens=args.max_tokens)
    runnable: Any = llm
    watcher = RetractionWatcher()
    if args.guard:
        policy = Policy.from_dict(
            {
                "name": "stream-demo",
                "rules": [{"name": "unsure", "when": {"stat": "max_eu", "op": ">", "value": 0.12}, "action": "abstain"}],
            }
        )
        runnable = LogTokUGuard(llm=llm, policy=policy, stream_mode="retract")

    print(f"Q: {args.question}\nA: ", end="", flush=True)
    full = None
    for chunk in runnable.stream(args.question, config={"callbacks": [watcher]}):
        items = chunk.response_metadata.get("logtoku", {}).get("tokens", [])
        if watcher.retracted is not None and chunk.chunk_position == "last":
            print(f"\n[withdrawn: {watcher.retracted['reason']}]\nA: {chunk.content}", end="")
        elif items:
            print(show(str(chunk.content), label(items[0], args.eu_threshold), color), end="", flush=True)
        else:
            print(chunk.content, end="", flush=True)
        full = chunk if full is None else full + chunk
    print()
    if full is None:
        return 1
    summary = full.response_metadata["logtoku"]
    legend = "I no idea, II one guess, III sure, IV several options" if summary["thresholds"] else "EU high / low"
    print(f"\nreliability {summary['reliability']:.4f} (higher = more reliable), {summary['n_tokens']} tokens; colours: {legend}")
    if summary["quadrant_shares"]:
        shares = ", ".join(f"{q} {s:.0%}" for q, s in summary["quadrant_shares"].items())
        print(f"quadrant shares: {shares}")
    if "logtoku_guard" in full.response_metadata:
        d = full.response_metadata["logtoku_guard"]
        print(f"guard: {d['action']} ({d['reason']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
