"""The shipped ordinary-questions benchmark, its generator (no model) and its loader."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from support.scripts import imported_script

from logtoku_eval.ordinary import WORDINGS, OrdinaryItem, dataset_name, default_path, load_ordinary
from logtoku_guard.calibration.self_labels import answer_matches, normalize_answer
from logtoku_guard.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ordinary" / "make_questions.py"
SOURCE = ROOT / "benchmarks" / "ordinary" / "questions.tsv"
FIELDS = ["id", "question_id", "category", "split", "wording", "question", "answers"]


@pytest.fixture(scope="module")
def gen():
    """``benchmarks/ordinary/make_questions.py`` imported as a module."""
    with imported_script(SCRIPT) as module:
        yield module


@pytest.fixture(scope="module")
def items() -> list[OrdinaryItem]:
    return load_ordinary()


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    return [json.loads(line) for line in default_path().read_text(encoding="utf-8").splitlines()]


# -- the shipped file -------------------------------------------------------------------------------------------
def test_the_file_ships_in_the_package_with_its_schema(raw) -> None:
    assert default_path() == ROOT / "logtoku_guard" / "calibration" / "data" / "ordinary.jsonl"
    assert all(list(r) == FIELDS for r in raw)
    assert all(isinstance(r["answers"], list) and r["answers"] and all(a.strip() for a in r["answers"]) for r in raw)


def test_at_least_600_questions_each_in_the_three_wordings(items) -> None:
    by_question: dict[str, list[OrdinaryItem]] = defaultdict(list)
    for it in items:
        by_question[it.question_id].append(it)
    assert len(by_question) >= 600
    assert len(items) == 3 * len(by_question)
    assert len({it.id for it in items}) == len(items)  # no duplicate ids
    for qid, group in by_question.items():
        assert [it.wording for it in group] == list(WORDINGS), qid
        assert [it.id for it in group] == [f"{qid}-{w}" for w in WORDINGS]
        sentence, lower, paraphrase = (it.question for it in group)
        assert lower == sentence.lower() and sentence != lower
        assert normalize_answer(paraphrase) != normalize_answer(sentence)
        assert all(q.endswith("?") for q in (sentence, paraphrase))
        assert len({(it.category, it.split, it.answers) for it in group}) == 1  # one question, one half, one answer set


def test_no_question_is_asked_twice_and_no_wording_gives_its_answer_away(items) -> None:
    sentences = Counter(normalize_answer(it.question) for it in items if it.wording != "lower")
    assert sentences.most_common(1)[0][1] == 1
    for it in items:  # an echo of the question never counts as correct
        assert not answer_matches(it.question, it.answers)[0], it.id


def test_split_by_question_half_and_half_within_each_category(items) -> None:
    sentence = [it for it in items if it.wording == "sentence"]
    categories = {it.category for it in sentence}
    assert len(categories) >= 10
    for c in categories:
        n = Counter(it.split for it in sentence if it.category == c)
        assert n["tune"] - n["test"] in (0, 1), (c, n)
    splits = {it.question_id: it.split for it in sentence}
    assert all(it.split == splits[it.question_id] for it in items)


def test_no_question_repeats_one_of_the_traffic_benchmark(items) -> None:
    from logtoku_eval.traffic import load_traffic

    traffic = {normalize_answer(it.question) for it in load_traffic()}
    assert not [it.id for it in items if normalize_answer(it.question) in traffic]


# -- the loader ---------------------------------------------------------------------------------------------------
def test_loader_filters_by_split_wording_and_category(items) -> None:
    tune, test = load_ordinary(split="tune"), load_ordinary(split="test")
    assert len(tune) + len(test) == len(items) and {it.split for it in tune} == {"tune"}
    assert not {it.question_id for it in tune} & {it.question_id for it in test}
    lower = load_ordinary(split="test", wordings=("lower",))
    assert {it.wording for it in lower} == {"lower"} and len(lower) == len(test) // 3
    capitals = load_ordinary(categories=("capital", "space"), wordings=("sentence", "paraphrase"))
    assert {it.category for it in capitals} == {"capital", "space"} and {it.wording for it in capitals} == {
        "sentence",
        "paraphrase",
    }
    assert [it.id for it in load_ordinary(split="test")] == [it.id for it in items if it.split == "test"]  # file order


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "dev"}, "split must be one of"),
        ({"wordings": ("upper",)}, "['upper']"),
        ({"categories": ("planets",)}, "['planets']"),
    ],
)
def test_loader_refuses_unknown_filters(kwargs, message) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_ordinary(**kwargs)


def test_to_qa_item_carries_the_references_and_the_wording(items) -> None:
    qa = items[1].to_qa_item()
    assert (qa.id, qa.question, qa.correct) == (items[1].id, items[1].question, items[1].answers)
    assert qa.category == f"{items[1].category}/lower"


def _record(**change: object) -> dict:
    base = {
        "id": "capital-001-sentence",
        "question_id": "capital-001",
        "category": "capital",
        "split": "tune",
        "wording": "sentence",
        "question": "What is the capital of Peru?",
        "answers": ["Lima"],
    }
    return {**base, **change}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_record(answers=[])], "'answers' must be a non-empty list"),
        ([_record(wording="upper", id="capital-001-upper")], "wording one of"),
        ([_record(split="dev")], "split must be 'tune' or 'test'"),
        ([_record(id="capital-002-sentence")], "is not '<question_id>-<wording>'"),
        ([_record(), _record()], "was already used on line 1"),
        ([{k: v for k, v in _record().items() if k != "question_id"}], "lacks 'question_id'"),
        ([_record(), _record(id="capital-001-lower", wording="lower", split="test")], "differ in category, split or answers"),
        (["[1, 2]"], "not an ordinary-question record"),
    ],
)
def test_loader_names_a_bad_file_and_the_fix(tmp_path: Path, lines: list, message: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"make_questions\.py") as err:
        load_ordinary(p)
    assert message in str(err.value)
    p.write_bytes(b'{"id": "\xff"}\n')
    with pytest.raises(ConfigurationError, match="not UTF-8"):
        load_ordinary(p)
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_ordinary(tmp_path / "missing.jsonl")


def test_dataset_name_follows_the_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(_record()) + "\n", encoding="utf-8")
    b.write_text(json.dumps(_record(answers=["Lima", "Ciudad de los Reyes"])) + "\n", encoding="utf-8")
    assert dataset_name(a) != dataset_name(b) and dataset_name(a).startswith("ordinary-")
    assert dataset_name() == dataset_name(default_path())


# -- the generator ------------------------------------------------------------------------------------------------
def test_the_generator_rebuilds_the_shipped_file_byte_for_byte(gen, tmp_path: Path) -> None:
    out = tmp_path / "ordinary.jsonl"
    gen.main(["--out", str(out)])
    assert out.read_bytes() == default_path().read_bytes()
    other = tmp_path / "seed1.jsonl"
    gen.main(["--out", str(other), "--seed", "1"])
    a, b = ([json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()] for p in (out, other))
    assert [r["question"] for r in a] == [r["question"] for r in b]  # same questions, other halves
    assert [r["split"] for r in a] != [r["split"] for r in b]


def _tsv(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "q.tsv"
    p.write_text("# header\n" + "".join(line + "\n" for line in lines), encoding="utf-8")
    return p


def test_the_generator_names_every_bad_line(gen, tmp_path: Path) -> None:
    good = "capital\tWhat is the capital of Peru?\tWhich city is Peru's capital?\tLima"
    rows = gen.read_source(_tsv(tmp_path, good, "space\tWhat is the red planet?\tWhich planet looks red?\tMars"))
    assert [r["question_id"] for r in rows] == ["capital-001", "space-001"]
    bad = [
        "capital\tWhat is the capital of Chile?\tWhich city is Chile's capital, Santiago or Lima?\tSantiago",  # echo
        "capital\tWhat is the capital of Peru?\tWhat is Peru's capital city?\tLima",  # repeats line 2
        "capital\tWhat is the capital of Spain\tWhich city is Spain's capital?\tMadrid",  # no '?'
        "capital\tWhat is the capital of Italy?\tWhat is the capital of Italy?\tRome",  # paraphrase = question
        "capital\tWhat is the capital of Japan?\tWhich city is Japan's capital?",  # three fields
        "capital\tWhat is the capital of Chad?\tWhich city is Chad's capital?\tN'Djamena|N'Djamena",  # repeated alias
    ]
    with pytest.raises(ValueError, match="6 bad line") as err:
        gen.read_source(_tsv(tmp_path, good, *bad))
    text = str(err.value)
    assert all(f"q.tsv:{n}:" in text for n in range(3, 9)), text
    assert "['Santiago'] appear in" in text and "repeats the question of" in text


def test_the_source_tsv_is_the_one_the_shipped_file_was_built_from(gen) -> None:
    rows = gen.read_source(SOURCE)
    shipped = [json.loads(line) for line in default_path().read_text(encoding="utf-8").splitlines()]
    assert len(shipped) == 3 * len(rows)
    assert [r["question"] for r in rows] == [r["question"] for r in shipped if r["wording"] == "sentence"]
