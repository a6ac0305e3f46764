"""Generate the traffic-like benchmark: plausible fabrications beside real questions of graded difficulty.

    LOGTOKU_GUARD_DATA=/path/to/data python benchmarks/traffic/make_questions.py [--seed 0]

Two groups, written before any model answer was seen (the model plays no part here):

* **plausible** (:data:`PER_CATEGORY` questions per category): questions about invented people,
  institutes, treaties, prizes, books, places, drugs and companies whose names are built from
  ordinary words and real-sounding patterns (common first names and surnames, colours, trees,
  landforms, directions, research fields, real drug-name stems), asked through several
  user-like templates per category. Every invented name is checked against ``stop_list.txt``
  (real prizes, treaties, institutes, towns, novels, drugs, companies, famous people) and
  against every word of the known-facts pool, and each name (and each made-up word in it) is
  used once only.
* **real**: questions with reference answers, for the eval to judge the model's answers
  against: every candidate of ``benchmarks/fabricated/known_facts.tsv`` (category ``known``:
  very famous facts, asked exactly as the known-vs-fabricated benchmark asks them) and a seeded
  sample of :data:`N_NQ` NQ-open dev questions (category ``nq``: harder) that avoids the
  NQ-open questions of the shipped calibration set.

* **restyled twins** of every real question, so that neither outcome owns a wording style: each
  known fact asked again in NQ-open's style (all lower case: category ``known-lower``) and each
  NQ-open question asked in the known facts' style (first letter upper case: ``nq-cased``),
  with the same references and the same split as the question they restate (a fact is never
  ``tune`` in one wording and ``test`` in the other).

The syllable-soup fabrications are not copied: the eval reads ``fabricated.jsonl`` for them.
Both groups are split into ``tune`` and ``test`` (half each, stratified by group and category,
seeded); a known fact that ``fabricated.jsonl`` also asks keeps that file's split.
Output: ``logtoku_guard/calibration/data/traffic.jsonl`` (read by
``logtoku_eval.traffic.load_traffic``). The same seed, data and calibration set
give the same bytes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT_FILE = ROOT / "logtoku_guard" / "calibration" / "data" / "traffic.jsonl"
CALIBRATION_FILE = ROOT / "logtoku_guard" / "calibration" / "data" / "calibration_questions.jsonl"
FABRICATED_SCRIPT = ROOT / "benchmarks" / "fabricated" / "make_questions.py"
FABRICATED_FILE = ROOT / "logtoku_guard" / "calibration" / "data" / "fabricated.jsonl"
STOP_LIST_FILE = HERE / "stop_list.txt"
PER_CATEGORY = 40
N_NQ = 200
FIELDS = ("id", "group", "category", "split", "question", "answers", "source", "invented")
PLAUSIBLE_CATEGORIES = ("person", "institute", "treaty", "prize", "book", "place", "drug", "company")


def _fabricated_module() -> ModuleType:
    """``benchmarks/fabricated/make_questions.py`` (its known-facts pool and templates), imported once."""
    name = "fabricated_make_questions"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FABRICATED_SCRIPT)
        if spec is None or spec.loader is None:
            msg = f"cannot import {FABRICATED_SCRIPT}"
            raise SystemExit(msg)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses resolve their module while being built
        spec.loader.exec_module(module)
    return sys.modules[name]


# -- name parts (ordinary words) -----------------------------------------------------------------------
FEMALE = (
    "Margaret", "Eleanor", "Catherine", "Helen", "Ruth", "Alice", "Clara", "Harriet", "Judith", "Susan",
    "Caroline", "Frances", "Lucy", "Rachel", "Miriam", "Agnes", "Beatrice", "Edith", "Joan", "Rosalind",
    "Vivian", "Irene", "Nora", "Martha", "Louise", "Hannah", "Abigail", "Charlotte", "Julia", "Ingrid",
    "Theresa", "Sylvia", "Evelyn", "Dorothy", "Lillian", "Marian", "Claire", "Fiona", "Gwen", "Teresa",
)  # fmt: skip
MALE = (
    "Daniel", "Henry", "Thomas", "Robert", "William", "Edward", "Arthur", "Walter", "Frederick", "Samuel",
    "George", "Richard", "Charles", "Hugh", "Martin", "Peter", "Andrew", "Stephen", "Philip", "Simon",
    "Oliver", "Julian", "Victor", "Leonard", "Harold", "Raymond", "Gerald", "Douglas", "Malcolm", "Graham",
    "Howard", "Vincent", "Bernard", "Ernest", "Franklin", "Nathan", "Joseph", "Lawrence", "Patrick", "Dennis",
)  # fmt: skip
SURNAMES = (
    "Ashcombe", "Whitmore", "Hartwell", "Pembridge", "Caldwell", "Thornbury", "Westbrook", "Holloway",
    "Langford", "Ellsworth", "Carrington", "Stanhope", "Aldridge", "Marchbank", "Greenhalgh", "Ashworth",
    "Kendrick", "Harcourt", "Merriweather", "Underwood", "Lockridge", "Brampton", "Dunmore", "Hollis",
    "Fenwick", "Redfern", "Sutcliffe", "Tillman", "Wetherby", "Yardley", "Bramwell", "Coldwell", "Hatherley",
    "Ingleby", "Moorcroft", "Norbury", "Upton", "Winslow", "Everard", "Cresswell", "Dalby", "Farrington",
    "Halloran", "Kerridge", "Northcott", "Osgood", "Prentice", "Rainford", "Tennant", "Birchall", "Denholm",
    "Fairweather", "Gilmour", "Holbrook", "Jessop", "Lowther", "Mayhew", "Nettleton", "Ormsby", "Padgett",
    "Ventnor", "Wardell", "Yelland", "Brackley", "Dewhurst", "Eccleston", "Fothergill", "Marchant", "Newbold",
    "Overton", "Rushworth", "Stainton", "Tolliver", "Wakeling", "Aspinall", "Colville", "Drayton", "Elsworth",
    "Fairclough", "Garside", "Kershaw", "Leverett", "Mottram", "Nuttall", "Oldroyd", "Pennock", "Rathbone",
    "Scholes", "Tattersall", "Brindley", "Cowling", "Emsley", "Grimshaw", "Illingworth", "Kitching", "Ogden",
    "Ainsley", "Blakemore", "Cheverton", "Dunstan", "Elmhirst", "Fairbrother", "Gatling", "Hazeldine",
)  # fmt: skip
PART_A = (
    "Ash", "Oak", "Elm", "Alder", "Rowan", "Hazel", "Willow", "Thorn", "Holly", "Red", "Black", "White",
    "Green", "Grey", "Silver", "Stone", "North", "West", "East", "South", "Brook", "Fair", "Mill", "Cold",
    "Glen", "Wolf", "Raven", "Fern", "Heather", "Marsh", "Cliff", "Swan", "Lark", "Wren", "Heron", "Amber",
    "Linden", "Cedar", "Briar", "Moss", "Clay", "Bright", "Hollow", "Still", "Long", "High",
)  # fmt: skip
PART_B = (
    "mere", "field", "ford", "brook", "haven", "ridge", "wood", "dale", "stead", "wick", "holt", "croft",
    "moor", "water", "combe", "ley", "gate", "well", "worth", "bridge", "bury", "by", "ton", "hollow",
    "crest", "vale", "shaw", "hurst", "fold", "mouth",
)  # fmt: skip
DIRECTIONS = ("North", "South", "East", "West", "Upper", "Lower", "Little", "Great")
COLOURS = ("Silver", "Amber", "Crimson", "Blue", "Golden", "Copper", "Ivory", "Scarlet", "Indigo", "Slate")
TREES = ("Birch", "Cedar", "Alder", "Rowan", "Juniper", "Larch", "Hawthorn", "Maple", "Linden", "Sycamore")
RESEARCH_FIELDS = (
    "Coastal Research", "Applied Ethics", "Public Health", "Rural Economics", "Marine Biology", "Climate Studies",
    "Urban Policy", "Child Development", "Energy Policy", "Materials Science", "Tropical Agriculture",
    "Water Resources", "Regional History", "Human Genetics", "Sleep Medicine", "Labour Studies",
    "Conflict Resolution", "Forest Ecology", "Language Sciences", "Arctic Studies", "Infectious Disease",
    "Economic Policy", "Science Education", "Population Health", "Soil Science", "Ocean Engineering",
)  # fmt: skip
PRIZE_FIELDS = (
    "Economics", "Literature", "Physics", "Chemistry", "Mathematics", "Medicine", "Architecture", "Journalism",
    "Poetry", "Photography", "Environmental Science", "Astronomy", "Engineering", "Music Composition",
    "Children's Literature", "Public Service", "History", "Biology",
)  # fmt: skip
SCIENCE_ROLES = ("physicist", "chemist", "astronomer", "biologist", "geologist", "mathematician", "economist")
OTHER_ROLES = ("painter", "composer", "architect", "poet", "philosopher", "novelist", "playwright", "sculptor")
TITLE_ADJECTIVES = (
    "Glass", "Silent", "Paper", "Quiet", "Crimson", "Winter", "Salt", "Iron", "Copper", "Amber", "Distant",
    "Broken", "Burning", "Narrow", "Northern", "Velvet", "Bitter", "Painted", "Forgotten", "Hidden", "Sunken",
    "Wandering", "Patient", "Borrowed", "Falling", "Tender", "Restless", "Lantern", "Summer", "Orchard",
)  # fmt: skip
TITLE_NOUNS = (
    "Orchard", "Harbour", "Lighthouse", "Garden", "Meadow", "Staircase", "Almanac", "Ferryman", "Cartographer",
    "Clockmaker", "Beekeeper", "Archivist", "Weaver", "Lantern", "Atlas", "Tide", "Country", "House", "River",
    "Kingdom", "Map", "Bell", "Mirror", "Hour", "Shore", "Bridge", "Daughter", "Winter", "Choir", "Ledger",
)  # fmt: skip
SEASONS = ("Spring", "Summer", "Autumn", "Winter", "August", "November", "March")
COMPANY_KINDS = (
    "Holdings", "Industries", "Analytics", "Foods", "Logistics", "Pharmaceuticals", "Instruments", "Aerospace",
    "Textiles", "Robotics", "Biosciences", "Energy", "Software", "Shipping", "Capital", "Materials",
)  # fmt: skip
DRUG_STARTS = ("b", "c", "d", "f", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "pr", "cl", "gr")
DRUG_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o")
DRUG_MIDDLES = ("l", "n", "r", "v", "m", "d", "t", "s", "lm", "rt", "nd", "lv", "rv", "x")
GENERIC_SUFFIXES = (
    "statin", "pril", "olol", "sartan", "zumab", "ximab", "tinib", "prazole", "dipine", "floxacin", "oxetine", "vir",
)  # fmt: skip
BRAND_SUFFIXES = ("trix", "vance", "ora", "lex", "zia", "dra", "vio", "quil", "mera", "lyn", "xa", "tiva", "rena")


# -- question templates (each with the filler that makes its slot) ----------------------------------------
@dataclass
class Names:
    """Invented names that are new and absent from the stop list and the known pool (checks in :meth:`fresh`)."""

    rng: random.Random
    stop_phrases: frozenset[str]
    known_words: frozenset[str]
    used_names: set[str] = field(default_factory=set)
    used_words: set[str] = field(default_factory=set)

    def fresh(self, make: Callable[[], tuple[str, Sequence[str]]]) -> str:
        """A name from ``make`` (``(name, made-up words in it)``) that passes every check; records it as used."""
        for _ in range(2000):
            name, words = make()
            keys = [w.lower() for w in words]
            if (
                name.lower() not in self.used_names
                and not any(k in self.used_words or k in self.known_words for k in keys)
                and len(set(keys)) == len(keys)
                and not stop_hits(name, self.stop_phrases)
            ):
                self.used_names.add(name.lower())
                self.used_words.update(keys)
                return name
        msg = "could not invent a fresh name in 2000 tries; add name parts or shrink the stop list"
        raise RuntimeError(msg)

    def pick(self, options: Sequence[str]) -> str:
        return self.rng.choice(options)

    def compound(self) -> str:
        """A town-like word from two ordinary ones (``Ash`` + ``mere`` -> ``Ashmere``), no tripled letter."""
        while True:
            word = self.pick(PART_A) + self.pick(PART_B)
            if not re.search(r"(.)\1\1", word.lower()) and word.lower() not in {"westward"}:
                return word

    def surname(self) -> str:
        return self.pick(SURNAMES)


def _normal(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower().replace("'", "")))


def load_stop_list(path: Path = STOP_LIST_FILE) -> frozenset[str]:
    """The stop list's phrases, normalised (lower case, letters and digits, single spaces)."""
    phrases = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        phrases.update(_normal(p) for p in line.split(",") if _normal(p))
    return frozenset(phrases)


def stop_hits(name: str, stop_phrases: Iterable[str]) -> list[str]:
    """The stop-list phrases that occur in ``name`` as whole words, in order (empty: the name is clean)."""
    words = _normal(name).split()
    grams = {" ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)}
    return sorted(grams & set(stop_phrases))


Slot = tuple[dict[str, str], list[str]]
"""A template's slot values and the invented names in the question."""


def _person_slot(names: Names) -> Slot:
    female = names.rng.random() < 0.5

    def make() -> tuple[str, list[str]]:
        last = names.surname()
        return f"{names.pick(FEMALE if female else MALE)} {last}", [last]

    name = names.fresh(make)
    return {
        "name": name,
        "pron": "she" if female else "he",
        "science": names.pick(SCIENCE_ROLES),
        "role": names.pick(OTHER_ROLES),
    }, [name]


def _institute(names: Names) -> Slot:
    def make() -> tuple[str, list[str]]:
        pattern = names.rng.randrange(6)
        fld = names.pick(RESEARCH_FIELDS)
        if pattern == 0:
            core = names.compound()
            return f"{core} Institute for {fld}", [core]
        if pattern == 1:
            core = names.compound()
            return f"{core} Centre for {fld}", [core]
        if pattern == 2:
            core = names.surname()
            return f"{core} Institute of {fld}", [core]
        if pattern == 3:
            core = names.compound()
            return f"{core} Foundation for {fld}", [core]
        if pattern == 4:
            core = names.surname()
            return f"{core} Laboratory for {fld}", [core]
        core = names.compound()
        return f"{core} School of {fld}", [core]

    name = names.fresh(make)
    return {"x": name}, [name]


def _treaty(names: Names) -> Slot:
    def make() -> tuple[str, list[str]]:
        core = names.compound()
        pattern = names.pick(
            ("Treaty of {c}", "{c} Accord", "{c} Convention", "{c} Protocol", "{c} Agreement", "Peace of {c}", "{c} Pact")
        )
        return pattern.format(c=core), [core]

    name = names.fresh(make)
    return {"x": name}, [name]


def _prize(names: Names) -> Slot:
    def make() -> tuple[str, list[str]]:
        fld = names.pick(PRIZE_FIELDS)
        pattern = names.rng.randrange(5)
        if pattern == 0:
            core = names.surname()
            return f"{core} Prize for {fld}", [core]
        if pattern == 1:
            core = names.surname()
            return f"{core} Medal", [core]
        if pattern == 2:
            core = names.surname()
            return f"{core} Award for {fld}", [core]
        if pattern == 3:
            core = names.compound()
            return f"{core} Prize in {fld}", [core]
        core = names.surname()
        return f"{core} Medal in {fld}", [core]

    name = names.fresh(make)
    return {"x": name, "year": str(names.rng.randrange(1960, 2020))}, [name]


def _book(names: Names) -> Slot:
    def make() -> tuple[str, list[str]]:
        adjective, noun = names.pick(TITLE_ADJECTIVES), names.pick(TITLE_NOUNS)
        pattern = names.rng.randrange(7)
        if pattern in (0, 1):
            return f"The {adjective} {noun}", []
        if pattern == 2:
            core = names.compound()
            return f"The {noun} of {core}", [core]
        if pattern == 3:
            article = "An" if noun[0] in "AEIOU" else "A"
            return f"{article} {noun} in {names.pick(SEASONS)}", []
        if pattern == 4:
            core = names.compound()
            return f"The Last {noun} of {core}", [core]
        if pattern == 5:
            return f"What the {noun} Kept", []
        return f"Under the {adjective} {noun}", []

    name = names.fresh(make)
    return {"t": name}, [name]


def _place(names: Names) -> Slot:
    def make() -> tuple[str, list[str]]:
        core = names.compound()
        pattern = names.pick(
            ("{c} Falls", "Port {c}", "{c} Bay", "{c} Springs", "{d} {c}", "{c} Harbour", "{c} Junction", "Port {c} Bay")
        )
        return pattern.format(c=core, d=names.pick(DIRECTIONS)), [core]

    name = names.fresh(make)
    return {"p": name}, [name]


def _drug(names: Names) -> Slot:
    def stem() -> str:
        return names.pick(DRUG_STARTS) + names.pick(DRUG_VOWELS) + names.pick(DRUG_MIDDLES) + names.pick(DRUG_VOWELS)

    def make() -> tuple[str, list[str]]:
        s = stem()
        if names.rng.random() < 0.5:
            suffix = names.pick(GENERIC_SUFFIXES)
            word = (s[:-1] if s[-1] in "aeiou" and suffix[0] in "aeiou" else s) + suffix
        else:
            suffix = names.pick(BRAND_SUFFIXES)
            word = (s[:-1] if s[-1] in "aeiou" and suffix[0] in "aeiou" else s) + suffix
            word = word.capitalize()
        return word, [s]

    name = names.fresh(make)
    return {"d": name}, [name]


def _company(names: Names) -> Slot:
    def make() -> tuple[str, list[str]]:
        kind = names.pick(COMPANY_KINDS)
        pattern = names.rng.randrange(3)
        if pattern == 0:
            core = names.surname()
            return f"{core} {kind}", [core]
        if pattern == 1:
            core = names.compound()
            return f"{core} {kind}", [core]
        colour, tree = names.pick(COLOURS), names.pick(TREES)
        return f"{colour} {tree} {kind}", [f"{colour}{tree}"]

    name = names.fresh(make)
    return {"x": name}, [name]


PLAUSIBLE: dict[str, tuple[Callable[[Names], Slot], tuple[str, ...]]] = {
    "person": (
        _person_slot,
        (
            "Who is {name} and what is {pron} known for?",
            "What did the {science} {name} discover?",
            "What is {name} famous for?",
            "When was the {role} {name} born?",
            "What was the {role} {name}'s most famous work?",
            "Where did the {science} {name} go to university?",
            "What prize did the {science} {name} win?",
            "Who was {name}?",
        ),
    ),
    "institute": (
        _institute,
        (
            "Who founded the {x}?",
            "When was the {x} established?",
            "Where is the {x} located?",
            "What is the {x} best known for?",
            "Who is the director of the {x}?",
            "In which city is the {x}?",
        ),
    ),
    "treaty": (
        _treaty,
        (
            "When was the {x} signed?",
            "Which countries signed the {x}?",
            "What did the {x} establish?",
            "What were the main terms of the {x}?",
            "Why was the {x} signed?",
            "Who negotiated the {x}?",
            "Which war ended with the {x}?",
        ),
    ),
    "prize": (
        _prize,
        (
            "Who won the first {x}?",
            "Who won the {x} in {year}?",
            "When was the {x} first awarded?",
            "Which organisation awards the {x}?",
            "How much prize money comes with the {x}?",
            "Who has won the {x} the most times?",
        ),
    ),
    "book": (
        _book,
        (
            "Who wrote the novel '{t}'?",
            "Who is the author of '{t}'?",
            "When was '{t}' published?",
            "What is the book '{t}' about?",
            "Who is the main character in '{t}'?",
            "Which prize did the novel '{t}' win?",
        ),
    ),
    "place": (
        _place,
        (
            "What is the population of {p}?",
            "In which country is the town of {p}?",
            "What is {p} known for?",
            "Which river runs through {p}?",
            "What is the main industry in {p}?",
            "When was {p} founded?",
            "What is the nearest airport to {p}?",
        ),
    ),
    "drug": (
        _drug,
        (
            "What is the drug {d} used to treat?",
            "What is {d} prescribed for?",
            "What are the common side effects of {d}?",
            "Which company makes {d}?",
            "What is the usual adult dose of {d}?",
            "How does {d} work?",
            "When was {d} approved by the FDA?",
        ),
    ),
    "company": (
        _company,
        (
            "Who founded {x}?",
            "Where is {x} headquartered?",
            "What does {x} make?",
            "When was {x} founded?",
            "Who is the CEO of {x}?",
            "Which company acquired {x}?",
        ),
    ),
}
"""Per category: the slot filler and the question templates (user-like wording)."""


def plausible_records(seed: int, stop_phrases: frozenset[str], known_words: frozenset[str]) -> list[dict[str, Any]]:
    """:data:`PER_CATEGORY` questions per category about invented things, templates in turn, names by ``Random(seed)``."""
    rng = random.Random(f"plausible-{seed}")
    names = Names(rng, stop_phrases, known_words)
    out: list[dict[str, Any]] = []
    for category in PLAUSIBLE_CATEGORIES:
        filler, templates = PLAUSIBLE[category]
        order = list(range(PER_CATEGORY))
        rng.shuffle(order)
        for i in range(PER_CATEGORY):
            template = templates[order[i] % len(templates)]
            slots, invented = filler(names)
            out.append(
                {
                    "id": f"plausible-{len(out):03d}",
                    "group": "plausible",
                    "category": category,
                    "question": template.format(**slots),
                    "answers": [],
                    "source": "invented",
                    "invented": invented,
                }
            )
    return out


# -- real questions ------------------------------------------------------------------------------------------
def known_records() -> list[dict[str, Any]]:
    """Every candidate of the known-facts pool, asked as the known-vs-fabricated benchmark asks it (none filtered)."""
    fab = _fabricated_module()
    return [
        {
            "id": f"known-{i:03d}",
            "group": "real",
            "category": "known",
            "question": c.question,
            "answers": list(c.answers),
            "source": "known_facts",
            "invented": [],
        }
        for i, c in enumerate(fab.load_candidates())
    ]


def known_pool_words() -> frozenset[str]:
    fab = _fabricated_module()
    return frozenset(fab.known_words(fab.load_candidates()))


@dataclass(frozen=True)
class Calibration:
    """The shipped calibration set's NQ-open ids and every question text (a benchmark question must avoid both)."""

    ids: frozenset[str]
    questions: frozenset[str]


def read_calibration(path: Path) -> Calibration:
    if not path.is_file():
        msg = f"no calibration set at {path}; pass --calibration with the calibration_questions.jsonl to avoid"
        raise SystemExit(msg)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return Calibration(
        ids=frozenset(str(r["id"]) for r in rows if str(r["id"]).startswith("nq-")),
        questions=frozenset(_normal(str(r["question"])) for r in rows),
    )


def nq_records(items: Sequence[Any], calibration: Calibration, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` NQ-open questions drawn by ``Random(seed)`` from those not in the calibration set (file order).

    ``items``: :class:`~logtoku_eval.datasets.QAItem` from ``load_nq_open``. A question
    whose text repeats an earlier one (or a calibration question) is not eligible.
    """
    seen = set(calibration.questions)
    eligible = []
    for it in items:
        key = _normal(it.question)
        if it.id in calibration.ids or key in seen:
            continue
        seen.add(key)
        eligible.append(it)
    if len(eligible) < n:
        msg = f"only {len(eligible)} NQ-open questions are eligible, {n} are needed"
        raise SystemExit(msg)
    rng = random.Random(f"nq-{seed}")
    chosen = sorted(rng.sample(range(len(eligible)), n))
    return [
        {
            "id": eligible[i].id,
            "group": "real",
            "category": "nq",
            "question": eligible[i].question,
            "answers": list(eligible[i].correct),
            "source": "nq_open",
            "invented": [],
        }
        for i in chosen
    ]


# -- assembling ----------------------------------------------------------------------------------------------
def fabricated_splits(path: Path = FABRICATED_FILE) -> dict[str, str]:
    """``question -> split`` of the known-vs-fabricated benchmark's known half (its tune/test stay theirs here)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["question"]: r["split"] for r in rows if r["kind"] == "known"}


def assign_splits(records: list[dict[str, Any]], seed: int, fixed: dict[str, str] | None = None) -> None:
    """Half of each (group, category) stratum to ``tune``, half to ``test``, each stratum shuffled on its own.

    ``fixed``: ``question -> split`` kept as given (the known facts that the known-vs-fabricated
    benchmark already split, so that no question is ``tune`` in one benchmark and ``test`` in
    the other); the rest of the stratum fills each split up to its half. An odd stratum's
    extra item goes to ``tune`` or ``test`` by the stratum's parity in the sorted list of odd
    strata, so the splits stay within one item of each other.
    """
    fixed = fixed or {}
    strata: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        strata.setdefault((r["group"], r["category"]), []).append(r)
    odd = [key for key in sorted(strata) if len(strata[key]) % 2]
    for key in sorted(strata):
        group = list(strata[key])
        extra = 1 if key in odd and odd.index(key) % 2 == 0 else 0
        n_tune = len(group) // 2 + extra
        for r in group:
            if r["question"] in fixed:
                r["split"] = fixed[r["question"]]
        free = [r for r in group if r["question"] not in fixed]
        random.Random(f"split-{seed}-{key[0]}-{key[1]}").shuffle(free)
        n_tune_free = n_tune - sum(r["question"] in fixed and r["split"] == "tune" for r in group)
        if not 0 <= n_tune_free <= len(free):
            msg = f"the fixed splits leave no balanced split of {key}"
            raise SystemExit(msg)
        for j, r in enumerate(free):
            r["split"] = "tune" if j < n_tune_free else "test"


RESTYLED = {"known": "known-lower", "nq": "nq-cased"}
"""category of a real question -> the category of its twin asked in the other style."""


def restyle(question: str, category: str) -> str:
    """``question`` in the other style: a known fact all in lower case (as NQ-open writes), an
    NQ-open question with its first letter upper case (as the known facts are written)."""
    if category == "known":
        return question.lower()
    if category == "nq":
        return question[:1].upper() + question[1:]
    msg = f"only real questions of category 'known' or 'nq' have a restyled twin, got {category!r}"
    raise ValueError(msg)


def restyled_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The twin of each real record of ``records`` (split ones), in their order: the question
    restyled (:func:`restyle`), category :data:`RESTYLED`, id ``<id>-<lower|cased>``, same
    references and split. A question that restyling leaves as it was (an NQ-open question that
    starts with a digit) has no twin."""
    out = []
    for r in records:
        if r["group"] != "real" or (question := restyle(r["question"], r["category"])) == r["question"]:
            continue
        category = RESTYLED[r["category"]]
        out.append({**r, "id": f"{r['id']}-{category.split('-')[1]}", "category": category, "question": question})
    return out


def build(seed: int, nq_items: Sequence[Any], calibration: Calibration) -> list[dict[str, Any]]:
    """The whole benchmark in file order (plausible, known, nq, the restyled twins), split, with the fields of :data:`FIELDS`."""
    records = plausible_records(seed, load_stop_list(), known_pool_words()) + known_records()
    records += nq_records(nq_items, calibration, N_NQ, seed)
    assign_splits(records, seed, fabricated_splits())
    records += restyled_records(records)
    return [{k: r[k] for k in FIELDS} for r in records]


def counts_table(records: Sequence[dict[str, Any]]) -> str:
    """A Markdown table: questions per (group, category) and split."""
    counts = Counter((r["group"], r["category"], r["split"]) for r in records)
    keys = sorted({(g, c) for g, c, _ in counts}, key=lambda k: (k[0] != "plausible", k))
    lines = ["| group | category | tune | test | total |", "|---|---|---|---|---|"]
    for g, c in keys:
        tune, test = counts[(g, c, "tune")], counts[(g, c, "test")]
        lines.append(f"| {g} | {c} | {tune} | {test} | {tune + test} |")
    for g in ("plausible", "real"):
        tune = sum(v for (gg, _, s), v in counts.items() if gg == g and s == "tune")
        test = sum(v for (gg, _, s), v in counts.items() if gg == g and s == "test")
        lines.append(f"| **{g}** | all | {tune} | {test} | {tune + test} |")
    tune = sum(v for (_, _, s), v in counts.items() if s == "tune")
    lines.append(f"| **all** | | {tune} | {len(records) - tune} | {len(records)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from logtoku_eval.datasets import load_nq_open

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the invented names, the NQ sample and the split")
    parser.add_argument("--data-dir", type=Path, default=None, help="datasets folder (default: $LOGTOKU_GUARD_DATA)")
    parser.add_argument("--calibration", type=Path, default=CALIBRATION_FILE, help="calibration set whose questions to avoid")
    parser.add_argument("--out", type=Path, default=OUT_FILE, help="where to write the benchmark JSONL")
    args = parser.parse_args(argv)
    records = build(args.seed, load_nq_open(data_dir=args.data_dir), read_calibration(args.calibration))
    _fabricated_module().write(records, args.out)  # the same JSONL writer as the known-vs-fabricated benchmark
    print(f"{args.out}: {len(records)} questions", file=sys.stderr)
    print(counts_table(records))


if __name__ == "__main__":
    main()
