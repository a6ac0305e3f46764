"""Generate the known-vs-fabricated benchmark (issue 12): questions the model knows vs questions about nothing.

    python benchmarks/fabricated/make_questions.py [--seed 0] [--check-model]

Two halves of equal size, made so that neither is cherry-picked:

* **known**: a candidate pool of very famous facts (``known_facts.tsv``: capitals, authors,
  inventors, painters, chemical symbols, formulated laws, ...; each with its accepted answers),
  asked through the templates in :data:`KNOWN_TEMPLATES`. ``--check-model`` asks the embedded
  model (SmolLM2-135M-Instruct) every candidate once, exactly as ``logtoku-guard eval`` does
  (prompt ``"Answer the question concisely. Q: {question} A:"``, greedy, at most 32 new
  tokens, stop at newline), judges each answer with the ``nq-match`` judge, and records every
  outcome in ``known_filter.jsonl``. Every candidate the judge marks correct is kept; nothing
  is picked by hand. Without ``--check-model`` the recorded outcomes are reused (no model).
* **fabricated**: as many questions about invented entities (people, institutes, books,
  places, chemicals, laws), from the templates in :data:`FABRICATED_TEMPLATES` (mostly the
  known templates' own wording) filled with names built from random syllables by a seeded
  RNG. Every invented name is checked against a stop-list of real names and against every
  word of the known pool, and is used once only. Written before any model answer was seen;
  the model plays no part in this half.

Both halves are split into ``tune`` and ``test`` (stratified by kind and category, seeded).
Output: ``logtoku_guard/calibration/data/fabricated.jsonl`` (read by
``logtoku_eval.fabricated.load_fabricated``). The same seed and filter file give
the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FACTS_FILE = HERE / "known_facts.tsv"
FILTER_FILE = HERE / "known_filter.jsonl"
OUT_FILE = ROOT / "logtoku_guard" / "calibration" / "data" / "fabricated.jsonl"
MIN_PER_KIND = 150
MAX_NEW_TOKENS = 32
BATCH_SIZE = 16
CATEGORIES = ("book", "chemical", "institute", "law", "person", "place")

# -- known half: templates over the fact pool ------------------------------------------------------
KNOWN_TEMPLATES: dict[str, str] = {
    "capital": "What is the capital of {x}?",
    "country-of": "In which country is {x}?",
    "continent-of": "On which continent is {x}?",
    "wrote": "Who wrote '{x}'?",
    "invented": "Who invented {x}?",
    "discovered": "Who discovered {x}?",
    "painted": "Who painted {x}?",
    "composed": "Who composed {x}?",
    "first": "Who was the first {x}?",
    "known-for": "What is {x} best known for?",
    "founded": "Who founded {x}?",
    "city-of": "In which city is {x}?",
    "symbol": "What is the chemical symbol for {x}?",
    "formula": "What is the chemical formula of {x}?",
    "element-of": "Which element has the chemical symbol {x}?",
    "used-for": "What is {x} used for?",
    "formulated": "Who formulated {x}?",
    "year": "In what year was {x} signed?",
    "country-law": "Which country adopted {x}?",
}

# -- fabricated half: random name parts --------------------------------------------------------------
ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "th", "v", "z", "qu", "h")
NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "y")
CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "x")
COUNTRY_SUFFIXES = ("ia", "ania", "istan", "land", "ora", "mark", "esh")
FIRST_ENDINGS = ("", "a", "o", "ine", "as", "el")
FIELDS = (
    "Marine Acoustics",
    "Applied Linguistics",
    "Tropical Medicine",
    "Theoretical Botany",
    "Comparative Law",
    "Polar Geology",
    "Quantum Optics",
    "Urban Ecology",
    "Medieval Studies",
    "Soil Chemistry",
    "Celestial Mechanics",
    "Cognitive Robotics",
    "Glacial Hydrology",
    "Structural Genomics",
    "Maritime History",
)
LAW_KINDS = ("Act", "Accord", "Treaty", "Statute", "Charter", "Convention", "Amendment", "Code")
PRINCIPLE_FIELDS = ("thermodynamics", "optics", "inheritance", "motion", "crystal growth", "heat transfer", "market pricing")
DEVICES = ("engine", "loom", "telescope", "valve", "lamp", "printing press", "pump", "compass", "barometer")
WORK_KINDS = ("Symphony", "Sonata", "Concerto", "Requiem", "Suite")
OFFICES = ("President", "Prime Minister", "King", "Chancellor", "Queen")
CORPS = ("Industries", "Systems", "Holdings", "Laboratories", "Motors", "Pharmaceuticals")
MUSEUM_KINDS = ("Museum of", "Academy of", "University of", "Observatory of")
CHEM_SUFFIXES = ("ine", "ol", "ate", "ite", "ane", "ide", "ene")
CHEM_PREFIXES = ("", "", "sodium ", "potassium ", "di", "tri", "methyl")
TITLE_NOUNS = (
    "Lanterns",
    "Orchard",
    "Winter",
    "Harbor",
    "Clockmaker",
    "Tides",
    "Garden",
    "Mirror",
    "Cartographer",
    "River",
    "Sparrows",
    "Widow",
    "Lighthouse",
    "Salt",
    "Bells",
    "Ashes",
    "Glassblower",
    "Daughter",
)
TITLE_PATTERNS = (
    "The {noun} of {place}",
    "{place}",
    "The Last {noun} of {place}",
    "Letters from {place}",
    "{place} {noun}",
    "Beyond {place}",
)

STOP_LIST_FILE = HERE / "stop_list.txt"
STOP_LIST = frozenset(
    w
    for line in STOP_LIST_FILE.read_text(encoding="utf-8").splitlines()
    if not line.startswith("#")
    for w in line.lower().split()
)
"""Real names an invented one must not coincide with (``stop_list.txt``)."""


_UNPRONOUNCEABLE = re.compile(r"[aeiouy]{3}|[^aeiouy]{4}|(.)\1\1")


def invented_word(rng: random.Random, syllables: int) -> str:
    """A pronounceable word of random syllables (onset + nucleus [+ coda]), capitalised, at most 10 letters."""
    while True:
        parts = []
        for i in range(syllables):
            coda = rng.choice(CODAS) if i == syllables - 1 else rng.choice(CODAS[:6])
            parts.append(rng.choice(ONSETS) + rng.choice(NUCLEI) + coda)
        word = "".join(parts)
        if len(word) <= 10 and not _UNPRONOUNCEABLE.search(word):
            return word.capitalize()


def _join(stem: str, suffix: str) -> str:
    """``stem + suffix`` without a doubled vowel at the seam (``bravo + ine`` -> ``bravine``)."""
    return stem[:-1] + suffix if stem[-1] in "aeiouy" and suffix[0] in "aeiouy" else stem + suffix


@dataclass
class NameMaker:
    """Invented names that are new (never repeated) and absent from ``forbidden`` (lower case)."""

    rng: random.Random
    forbidden: frozenset[str]
    used: set[str]

    def _fresh(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            word = make()
            key = word.lower()
            if len(key) >= 4 and key not in self.forbidden and key not in self.used:
                self.used.add(key)
                return word
        msg = "could not invent a fresh name in 1000 tries"
        raise RuntimeError(msg)

    def word(self, syllables: tuple[int, ...] = (2, 3)) -> str:
        return self._fresh(lambda: invented_word(self.rng, self.rng.choice(syllables)))

    def first_name(self) -> str:
        return self._fresh(self._first)

    def _first(self) -> str:
        word, ending = invented_word(self.rng, 2), self.rng.choice(FIRST_ENDINGS)
        return _join(word, ending) if ending else word

    def person(self) -> tuple[str, list[str]]:
        first, last = self.first_name(), self.word()
        return f"{first} {last}", [first, last]

    def country(self) -> tuple[str, list[str]]:
        name = self._fresh(lambda: _join(invented_word(self.rng, self.rng.choice((1, 2))), self.rng.choice(COUNTRY_SUFFIXES)))
        return name, [name]

    def chemical(self) -> tuple[str, list[str]]:
        stem = self._fresh(lambda: _join(invented_word(self.rng, 2).lower(), self.rng.choice(CHEM_SUFFIXES)))
        return self.rng.choice(CHEM_PREFIXES) + stem, [stem]

    def title(self) -> tuple[str, list[str]]:
        place = self.word()
        pattern = self.rng.choice(TITLE_PATTERNS)
        return pattern.format(noun=self.rng.choice(TITLE_NOUNS), place=place), [place]


Filler = Callable[[NameMaker], tuple[str, list[str]]]
"""Builds a template's slot text and the invented words in it."""


def _quoted(names: NameMaker) -> tuple[str, list[str]]:
    title, words = names.title()
    return f"'{title}'", words


def _institute(names: NameMaker) -> tuple[str, list[str]]:
    place = names.word()
    return f"the {place}ian Institute of {names.rng.choice(FIELDS)}", [place]


def _company(names: NameMaker) -> tuple[str, list[str]]:
    word = names.word()
    return f"{word} {names.rng.choice(CORPS)}", [word]


def _museum(names: NameMaker) -> tuple[str, list[str]]:
    word = names.word()
    return f"the {word} {names.rng.choice(MUSEUM_KINDS)} {names.rng.choice(FIELDS)}", [word]


def _law(names: NameMaker) -> tuple[str, list[str]]:
    word = names.word()
    return f"the {word} {names.rng.choice(LAW_KINDS)}", [word]


def _principle(names: NameMaker) -> tuple[str, list[str]]:
    word = names.word()
    return f"the {word} principle of {names.rng.choice(PRINCIPLE_FIELDS)}", [word]


def _device(names: NameMaker) -> tuple[str, list[str]]:
    word = names.word()
    return f"the {word} {names.rng.choice(DEVICES)}", [word]


def _work(names: NameMaker) -> tuple[str, list[str]]:
    word = names.word()
    return f"the {word} {names.rng.choice(WORK_KINDS)}", [word]


def _office(names: NameMaker) -> tuple[str, list[str]]:
    country, words = names.country()
    return f"{names.rng.choice(OFFICES)} of {country}", words


def _city(names: NameMaker) -> tuple[str, list[str]]:
    word = names.word()
    return f"the city of {word}", [word]


def _element(names: NameMaker) -> tuple[str, list[str]]:
    stem = names._fresh(lambda: _join(invented_word(names.rng, 2).lower(), "ium"))
    return stem, [stem]


# category -> (template id, template text, filler); the text is the known template's wording
# wherever one fits, so the form of a question does not give its kind away.
FABRICATED_TEMPLATES: dict[str, tuple[tuple[str, str, Filler], ...]] = {
    "person": (
        ("known-for", KNOWN_TEMPLATES["known-for"], NameMaker.person),
        ("invented", KNOWN_TEMPLATES["invented"], _device),
        ("painted", KNOWN_TEMPLATES["painted"], _quoted),
        ("composed", KNOWN_TEMPLATES["composed"], _work),
        ("first", KNOWN_TEMPLATES["first"], _office),
        ("born", "In what year was {x} born?", NameMaker.person),
    ),
    "institute": (
        ("founded", KNOWN_TEMPLATES["founded"], _institute),
        ("founded-company", KNOWN_TEMPLATES["founded"], _company),
        ("city-of", KNOWN_TEMPLATES["city-of"], _museum),
    ),
    "book": (
        ("wrote", KNOWN_TEMPLATES["wrote"], lambda n: n.title()),
        ("wrote-novel", "Who wrote the novel '{x}'?", lambda n: n.title()),
        ("published", "In what year was '{x}' published?", lambda n: n.title()),
    ),
    "place": (
        ("capital", KNOWN_TEMPLATES["capital"], NameMaker.country),
        ("country-of", KNOWN_TEMPLATES["country-of"], _city),
        ("continent-of", KNOWN_TEMPLATES["continent-of"], NameMaker.country),
    ),
    "chemical": (
        ("formula", KNOWN_TEMPLATES["formula"], NameMaker.chemical),
        ("symbol", KNOWN_TEMPLATES["symbol"], _element),
        ("used-for", KNOWN_TEMPLATES["used-for"], NameMaker.chemical),
        ("discovered", KNOWN_TEMPLATES["discovered"], NameMaker.chemical),
    ),
    "law": (
        ("formulated", KNOWN_TEMPLATES["formulated"], _principle),
        ("year", KNOWN_TEMPLATES["year"], _law),
        ("year-passed", "What year was {x} passed?", _law),
        ("country-law", KNOWN_TEMPLATES["country-law"], _law),
    ),
}


# -- the known candidate pool -------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One known-fact question before the model filter."""

    id: str
    category: str
    template: str
    question: str
    answers: tuple[str, ...]


def _norm(text: str) -> str:
    from logtoku_eval.judges import normalize_answer

    return normalize_answer(text)


def load_candidates(path: Path = FACTS_FILE) -> list[Candidate]:
    """The known pool in file order. Aliases the question itself contains are dropped (an echo is not knowledge)."""
    out: list[Candidate] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        category, template, subject, answers = line.split("\t")
        if category not in CATEGORIES or template not in KNOWN_TEMPLATES:
            msg = f"{path.name}: unknown category or template in {line!r}"
            raise ValueError(msg)
        question = KNOWN_TEMPLATES[template].format(x=subject)
        padded = f" {_norm(question)} "
        kept = tuple(a for a in answers.split("|") if f" {_norm(a)} " not in padded)
        if not kept:
            msg = f"{path.name}: every answer of {question!r} is in the question itself"
            raise ValueError(msg)
        out.append(Candidate(f"cand-{len(out):03d}", category, template, question, kept))
    if len({c.question for c in out}) != len(out):
        msg = f"{path.name}: a question appears twice"
        raise ValueError(msg)
    return out


def known_words(candidates: Sequence[Candidate]) -> frozenset[str]:
    """Every word of the known pool's questions and answers (lower case): invented names must avoid them."""
    return frozenset(w for c in candidates for text in (c.question, *c.answers) for w in re.findall(r"[a-z]+", text.lower()))


# -- the model filter ---------------------------------------------------------------------------------
def check_model(candidates: Sequence[Candidate], path: Path = FILTER_FILE) -> None:
    """Ask the embedded model every candidate once, judge with ``nq-match``, write every outcome to ``path``."""
    from logtoku_eval.datasets import QAItem
    from logtoku_eval.generate import PROMPT_TEMPLATE, GreedySpec, qa_prompt
    from logtoku_eval.judges import MatchJudge
    from logtoku_guard.backends.transformers import TransformersBackend

    backend = TransformersBackend()
    spec = GreedySpec(max_new_tokens=MAX_NEW_TOKENS)
    judge = MatchJudge()
    rows: list[dict[str, Any]] = []
    for start in range(0, len(candidates), BATCH_SIZE):
        chunk = candidates[start : start + BATCH_SIZE]
        generations = backend.batch([qa_prompt(c.question) for c in chunk], spec.options())
        answers = [g.text.strip() for g in generations]
        verdicts = judge.judge_many([QAItem(c.id, c.question, c.answers) for c in chunk], answers)
        for c, a, v in zip(chunk, answers, verdicts):
            rows.append(
                {
                    "id": c.id,
                    "category": c.category,
                    "template": c.template,
                    "question": c.question,
                    "answers": list(c.answers),
                    "model_answer": a,
                    "correct": v.correct,
                }
            )
        print(f"{len(rows)}/{len(candidates)} candidates asked", file=sys.stderr)
    meta = {
        "meta": {
            "model": backend.model_name,
            "prompt": PROMPT_TEMPLATE,
            "decoding": spec.name,
            "judge": judge.name,
            "candidates": len(rows),
            "correct": sum(r["correct"] for r in rows),
        }
    }
    with open(path, "w", encoding="utf-8") as fh:
        for row in (meta, *rows):
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_filter(candidates: Sequence[Candidate], path: Path = FILTER_FILE) -> list[Candidate]:
    """The candidates the recorded model run answered correctly (checks the record matches the pool)."""
    if not path.is_file():
        msg = f"no model filter at {path}; run with --check-model once"
        raise SystemExit(msg)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if "meta" not in r]
    recorded = [(r["id"], r["question"], tuple(r["answers"])) for r in rows]
    if recorded != [(c.id, c.question, c.answers) for c in candidates]:
        msg = f"{path.name} does not match {FACTS_FILE.name} (the pool changed); run with --check-model again"
        raise SystemExit(msg)
    return [c for c, r in zip(candidates, rows) if r["correct"]]


# -- assembling the benchmark -------------------------------------------------------------------------
def fabricated_records(n: int, seed: int, forbidden: frozenset[str]) -> list[dict[str, Any]]:
    """``n`` questions about invented entities, categories in turn, template and names by ``Random(seed)``."""
    rng = random.Random(seed)
    names = NameMaker(rng, forbidden, set())
    out = []
    for i in range(n):
        category = CATEGORIES[i % len(CATEGORIES)]
        template_id, text, fill = rng.choice(FABRICATED_TEMPLATES[category])
        slot, invented = fill(names)
        out.append(
            {
                "id": f"fab-{i:03d}",
                "kind": "fabricated",
                "category": category,
                "template": template_id,
                "question": text.format(x=slot),
                "answers": [],
                "invented": invented,
            }
        )
    return out


def known_records(kept: Sequence[Candidate]) -> list[dict[str, Any]]:
    return [
        {
            "id": f"known-{i:03d}",
            "kind": "known",
            "category": c.category,
            "template": c.template,
            "question": c.question,
            "answers": list(c.answers),
            "invented": [],
        }
        for i, c in enumerate(kept)
    ]


def assign_splits(records: list[dict[str, Any]], seed: int) -> None:
    """Half of each (kind, category) stratum to ``tune``, half to ``test``; odd strata alternate the extra one."""
    rng = random.Random(f"split-{seed}")
    strata: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        strata.setdefault((r["kind"], r["category"]), []).append(r)
    extra_to_tune = True
    for key in sorted(strata):
        group = list(strata[key])
        rng.shuffle(group)
        n_tune = len(group) // 2 + (len(group) % 2 if extra_to_tune else 0)
        if len(group) % 2:
            extra_to_tune = not extra_to_tune
        for j, r in enumerate(group):
            r["split"] = "tune" if j < n_tune else "test"


def build(seed: int, kept: Sequence[Candidate], candidates: Sequence[Candidate]) -> list[dict[str, Any]]:
    """The whole benchmark: the known items kept by the filter, as many fabricated ones, split."""
    if len(kept) < MIN_PER_KIND:
        msg = f"the model knows only {len(kept)} candidates (< {MIN_PER_KIND}); add facts to {FACTS_FILE.name}"
        raise SystemExit(msg)
    forbidden = STOP_LIST | known_words(candidates)
    records = known_records(kept) + fabricated_records(len(kept), seed, forbidden)
    assign_splits(records, seed)
    keys = ("id", "kind", "category", "template", "split", "question", "answers", "invented")
    return [{k: r[k] for k in keys} for r in records]


def write(records: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the invented names and of the split (default 0)")
    parser.add_argument("--check-model", action="store_true", help="ask the embedded model every candidate, rewrite the filter")
    parser.add_argument(
        "--filter", type=Path, default=FILTER_FILE, help="the model-filter record (read, or written by --check-model)"
    )
    parser.add_argument("--out", type=Path, default=OUT_FILE, help="where to write the benchmark JSONL")
    args = parser.parse_args(argv)
    candidates = load_candidates()
    if args.check_model:
        check_model(candidates, args.filter)
    records = build(args.seed, read_filter(candidates, args.filter), candidates)
    write(records, args.out)
    n_known = sum(r["kind"] == "known" for r in records)
    print(f"{args.out}: {len(records)} questions ({n_known} known of {len(candidates)} candidates)", file=sys.stderr)


if __name__ == "__main__":
    main()
