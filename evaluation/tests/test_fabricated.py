"""The shipped known-vs-fabricated benchmark and its generator (no model: the recorded filter is reused)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from support.scripts import imported_script

from logtoku_eval.fabricated import FabricatedItem, dataset_name, default_path, load_fabricated
from logtoku_guard.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "fabricated" / "make_questions.py"


@pytest.fixture(scope="module")
def gen():
    """``make_questions.py`` imported as a module."""
    with imported_script(SCRIPT) as module:
        yield module


@pytest.fixture(scope="module")
def items() -> list[FabricatedItem]:
    return load_fabricated("all")


def test_shipped_file_is_inside_the_core_package():
    """The core ships it: ``calibrate --fit-guard`` reads its invented-name questions."""
    path = default_path()
    assert path.is_file()
    assert path.parent == ROOT / "logtoku_guard" / "calibration" / "data"


def test_size_and_balanced_halves(items):
    assert len(items) >= 300
    kinds = Counter(it.kind for it in items)
    assert kinds["known"] == kinds["fabricated"] >= 150
    assert set(kinds) == {"known", "fabricated"}


def test_splits_partition_and_are_stratified(items):
    tune, test = load_fabricated("tune"), load_fabricated("test")
    assert len(tune) + len(test) == len(items)
    assert {it.id for it in tune}.isdisjoint({it.id for it in test})
    assert abs(len(tune) - len(test)) <= 1
    strata = Counter((it.kind, it.category) for it in items)
    tune_strata = Counter((it.kind, it.category) for it in tune)
    for key, n in strata.items():
        assert tune_strata[key] in (n // 2, n - n // 2), key
    for split in (tune, test):
        kinds = Counter(it.kind for it in split)
        assert abs(kinds["known"] - kinds["fabricated"]) <= len(strata)


def test_no_duplicate_questions_or_ids(items):
    assert len({it.question for it in items}) == len(items)
    assert len({it.id for it in items}) == len(items)


def test_known_items_have_answers_and_fabricated_ones_none(items):
    for it in items:
        if it.is_known:
            assert it.answers and all(a.strip() for a in it.answers), it
            assert not it.invented
        else:
            assert it.answers == ()
            assert it.invented, it
            for word in it.invented:
                assert word in it.question, it


def test_categories_cover_every_invented_entity_kind(items):
    fabricated = Counter(it.category for it in items if not it.is_known)
    assert set(fabricated) == {"person", "institute", "book", "place", "chemical", "law"}
    assert max(fabricated.values()) - min(fabricated.values()) <= 1


def test_invented_names_avoid_the_known_pool_and_the_stop_list(items, gen):
    candidates = gen.load_candidates()
    pool_words = gen.known_words(candidates)
    invented = [w.lower() for it in items for w in it.invented]
    assert len(set(invented)) == len(invented), "an invented name is used twice"
    for word in invented:
        assert word not in gen.STOP_LIST
        assert word not in pool_words
    known_text = " ".join(it.question.lower() for it in items if it.is_known)
    for word in invented:
        assert not re.search(rf"\b{re.escape(word)}\b", known_text)


def test_known_items_are_exactly_the_candidates_the_recorded_model_run_got_right(items, gen):
    rows = [json.loads(line) for line in gen.FILTER_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    meta = rows[0]["meta"]
    assert meta["judge"] == "nq-match"
    right = [r["question"] for r in rows[1:] if r["correct"]]
    assert [it.question for it in items if it.is_known] == right
    assert meta["correct"] == len(right)


def test_generator_is_deterministic_and_reproduces_the_shipped_file(gen, tmp_path):
    out = tmp_path / "fabricated.jsonl"
    gen.main(["--seed", "0", "--out", str(out)])
    assert out.read_bytes() == default_path().read_bytes()


def test_another_seed_gives_other_names_and_splits(gen):
    candidates = gen.load_candidates()
    kept = gen.read_filter(candidates)
    a, b = gen.build(0, kept, candidates), gen.build(1, kept, candidates)
    assert gen.build(1, kept, candidates) == b
    assert [r["question"] for r in a if r["kind"] == "fabricated"] != [r["question"] for r in b if r["kind"] == "fabricated"]
    assert [r["question"] for r in a if r["kind"] == "known"] == [r["question"] for r in b if r["kind"] == "known"]


def test_qa_item_view(items):
    known = next(it for it in items if it.is_known)
    qa = known.to_qa_item()
    assert (qa.id, qa.question, qa.correct) == (known.id, known.question, known.answers)
    assert qa.category == f"known/{known.category}"


def test_bad_split_is_refused():
    with pytest.raises(ConfigurationError, match="split must be one of"):
        load_fabricated("train")


def test_malformed_file_is_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "question": "q?"}) + "\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="not a known-vs-fabricated record"):
        load_fabricated(path=bad)
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_fabricated(path=missing)
    bad.write_text('{"id": "x", "question": "broken\n', encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"bad.jsonl:1: not JSON .*make_questions.py"):
        load_fabricated(path=bad)
    bad.write_text("[1]\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"bad.jsonl:1: not a known-vs-fabricated record \(a JSON object\)"):
        load_fabricated(path=bad)
    bad.write_bytes(b"\xff\n")
    with pytest.raises(ConfigurationError, match="is not UTF-8"):
        load_fabricated(path=bad)


def test_dataset_name_follows_the_content(tmp_path):
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(default_path().read_bytes())
    assert dataset_name() == dataset_name(copy)
    assert re.fullmatch(r"fabricated-[0-9a-f]{8}", dataset_name())
    copy.write_bytes(default_path().read_bytes().replace(b"capital", b"Capital", 1))
    assert dataset_name(copy) != dataset_name()
