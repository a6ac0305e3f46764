"""Rebuild the shipped default calibration set from the full TruthfulQA and NQ-open files.

    LOGTOKU_GUARD_DATA=../shared/data .venv/bin/python scripts/make_calibration_set.py

writes ``logtoku_guard/calibration/data/calibration_questions.jsonl``: 100 questions spread
evenly over TruthfulQA (Apache-2.0) and 100 over NQ-open dev (CC BY-SA 3.0), each with its
reference answers, in the order :func:`~logtoku_guard.calibration.default_calibration_prompts`
reads them. The licences lie beside it in the same folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from logtoku_guard.calibration.datasets import QAItem, load_nq_open, load_truthfulqa
from logtoku_guard.calibration.prompts import CALIBRATION_QUESTIONS

N = 200


def spread(items: list[QAItem], n: int) -> list[QAItem]:
    return items[:: max(1, len(items) // n)][:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None, help="datasets folder (default: $LOGTOKU_GUARD_DATA)")
    parser.add_argument("--out", type=Path, default=CALIBRATION_QUESTIONS)
    args = parser.parse_args()
    rows = [("truthfulqa", i) for i in spread(load_truthfulqa(data_dir=args.data_dir), N // 2)]
    rows += [("nq_open", i) for i in spread(load_nq_open(data_dir=args.data_dir), N - N // 2)]
    with args.out.open("w", encoding="utf-8") as fh:
        for source, item in rows:
            question = item.question if item.question.endswith("?") else item.question + "?"
            record = {"id": item.id, "source": source, "question": question, "answers": list(item.correct)}
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"{len(rows)} questions written to {args.out}")  # a script, not library code


if __name__ == "__main__":
    main()
