"""Build the ordinary-questions benchmark from ``questions.tsv`` (see README.md in this folder).

Each line of ``questions.tsv`` is one plain factual question a small chat model should mostly
know, written by hand before any model answer was seen: its category, its sentence-case
wording, a paraphrase and its accepted answers. Every question is asked in three wordings:

* ``sentence``: as written ("What is the capital of Cambodia?");
* ``lower``: the same, all lower case ("what is the capital of cambodia?");
* ``paraphrase``: the hand-written rewording ("Which city is Cambodia's capital?").

Questions (not wordings) are split half ``tune``, half ``test`` within each category (a seeded
shuffle; an odd category gives its extra question to ``tune``), so a fact is never tune in one
wording and test in another. Output: ``logtoku_guard/calibration/data/ordinary.jsonl``, one
record a line: ``id`` (``<question_id>-<wording>``), ``question_id`` (``<category>-NNN``, the
question's place in its category), ``category``, ``split``, ``wording``, ``question``,
``answers`` (canonical first). The same TSV and seed give the same bytes.

Checks made while building (a failure names the line): four tab-separated fields; both
wordings end with ``?`` and differ; at least one answer; no accepted answer appears, as whole
words after the judge's normalisation, in the question or its paraphrase (an echo of the
question would then count as correct); no question repeats another (normalised), or one of
the traffic benchmark (``traffic.jsonl``: every known fact of ``benchmarks/fabricated/known_facts.tsv``
as asked there, and its NQ-open questions).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOURCE = HERE / "questions.tsv"
OUT = ROOT / "logtoku_guard" / "calibration" / "data" / "ordinary.jsonl"
TRAFFIC = ROOT / "logtoku_guard" / "calibration" / "data" / "traffic.jsonl"
WORDINGS = ("sentence", "lower", "paraphrase")
SEED = 0


def _normalize(text: str) -> str:
    from logtoku_guard.calibration.self_labels import normalize_answer  # the judge's normalisation

    return normalize_answer(text)


def read_source(path: Path = SOURCE) -> list[dict[str, object]]:
    """The questions of ``path``, checked (``ValueError`` naming every bad line)."""
    rows: list[dict[str, object]] = []
    problems: list[str] = []
    per_category: Counter[str] = Counter()
    seen: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{path}:{n}"
        fields = line.split("\t")
        if len(fields) != 4 or not all(f.strip() == f and f for f in fields):
            problems.append(f"{where}: want 4 non-empty tab-separated fields without outer spaces, got {fields!r}")
            continue
        category, question, paraphrase, answers_text = fields
        answers = answers_text.split("|")
        if not all(a.strip() == a and a for a in answers) or len(set(answers)) != len(answers):
            problems.append(f"{where}: answers must be distinct non-empty texts separated by '|', got {answers_text!r}")
        if not question.endswith("?") or not paraphrase.endswith("?") or question[0] != question[0].upper():
            problems.append(
                f"{where}: both wordings end with '?' and the question starts upper case, got {question!r} / {paraphrase!r}"
            )
        if _normalize(question) == _normalize(paraphrase):
            problems.append(f"{where}: the paraphrase {paraphrase!r} repeats the question")
        for wording in (question, paraphrase):
            norm = f" {_normalize(wording)} "
            echoed = [a for a in answers if f" {_normalize(a)} " in norm]
            if echoed:
                problems.append(f"{where}: the answer(s) {echoed!r} appear in {wording!r}; an echo would count as correct")
            key = _normalize(wording)
            if seen.get(key) == where:  # the paraphrase repeats its own question: reported above
                continue
            if key in seen:
                problems.append(f"{where}: {wording!r} repeats the question of {seen[key]}")
            seen[key] = where
        per_category[category] += 1
        rows.append(
            {
                "question_id": f"{category}-{per_category[category]:03d}",
                "category": category,
                "question": question,
                "paraphrase": paraphrase,
                "answers": answers,
            }
        )
    if problems:
        raise ValueError(f"{len(problems)} bad line(s) in {path}:\n" + "\n".join(problems))
    return rows


def traffic_questions(path: Path = TRAFFIC) -> set[str]:
    """The normalised questions of the traffic benchmark (every known fact of
    ``benchmarks/fabricated/known_facts.tsv`` as asked there, in both styles, and its NQ-open ones)."""
    return {
        _normalize(str(json.loads(line)["question"])) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    }


def assign_splits(rows: Sequence[dict[str, object]], seed: int = SEED) -> dict[str, str]:
    """question_id -> ``tune`` | ``test``: half of each category each (seeded; the odd one to tune)."""
    splits: dict[str, str] = {}
    for category in sorted({str(r["category"]) for r in rows}):
        ids = [str(r["question_id"]) for r in rows if r["category"] == category]
        random.Random(f"ordinary-split-{seed}-{category}").shuffle(ids)
        n_tune = (len(ids) + 1) // 2
        splits.update({q: ("tune" if i < n_tune else "test") for i, q in enumerate(ids)})
    return splits


def records(rows: Sequence[dict[str, object]], seed: int = SEED) -> list[dict[str, object]]:
    """One record per question and wording, in source order (sentence, lower, paraphrase)."""
    splits = assign_splits(rows, seed)
    out: list[dict[str, object]] = []
    for r in rows:
        qid, question = str(r["question_id"]), str(r["question"])
        texts = {"sentence": question, "lower": question.lower(), "paraphrase": str(r["paraphrase"])}
        for wording in WORDINGS:
            out.append(
                {
                    "id": f"{qid}-{wording}",
                    "question_id": qid,
                    "category": r["category"],
                    "split": splits[qid],
                    "wording": wording,
                    "question": texts[wording],
                    "answers": list(r["answers"]),  # type: ignore[call-overload]
                }
            )
    return out


def table(recs: Sequence[dict[str, object]]) -> str:
    """Questions per category and split (each is asked in the three wordings)."""
    sentence = [r for r in recs if r["wording"] == "sentence"]
    lines = ["| category | tune | test | total |", "|---|---|---|---|"]
    for category in sorted({str(r["category"]) for r in sentence}):
        c = Counter(str(r["split"]) for r in sentence if r["category"] == category)
        lines.append(f"| {category} | {c['tune']} | {c['test']} | {c['tune'] + c['test']} |")
    c = Counter(str(r["split"]) for r in sentence)
    lines.append(f"| **all** | {c['tune']} | {c['test']} | {c['tune'] + c['test']} |")
    return "\n".join(lines)


def build(source: Path = SOURCE, seed: int = SEED) -> list[dict[str, object]]:
    rows = read_source(source)
    known = traffic_questions()
    repeated = [str(r[k]) for r in rows for k in ("question", "paraphrase") if _normalize(str(r[k])) in known]
    if repeated:
        msg = f"these questions repeat the traffic benchmark's verbatim (ask them another way): {repeated!r}"
        raise ValueError(msg)
    return records(rows, seed)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=SOURCE, help="the hand-written TSV (default: questions.tsv here)")
    parser.add_argument("--out", type=Path, default=OUT, help="the JSONL to write (default: the package's ordinary.jsonl)")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the tune/test split (default 0)")
    args = parser.parse_args(argv)
    recs = build(args.source, args.seed)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    args.out.write_text(text, encoding="utf-8")
    print(f"{len(recs)} records ({len(recs) // len(WORDINGS)} questions x {len(WORDINGS)} wordings) -> {args.out}")
    print(table(recs))


if __name__ == "__main__":
    main()
