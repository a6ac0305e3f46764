"""The shipped traffic-like benchmark, its generator (no model, no shared data) and its loader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from support.scripts import imported_script

from logtoku_eval.datasets import load_nq_open
from logtoku_eval.fabricated import load_fabricated
from logtoku_eval.traffic import TrafficItem, dataset_name, default_path, load_traffic
from logtoku_guard.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "traffic" / "make_questions.py"
CALIBRATION = ROOT / "logtoku_guard" / "calibration" / "data" / "calibration_questions.jsonl"


@pytest.fixture(scope="module")
def gen():
    """``benchmarks/traffic/make_questions.py`` imported as a module."""
    with imported_script(SCRIPT) as module:
        yield module


@pytest.fixture(scope="module")
def items() -> list[TrafficItem]:
    return load_traffic()


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    return [json.loads(line) for line in default_path().read_text(encoding="utf-8").splitlines()]


def _nq_folder(root: Path, n: int) -> Path:
    """A datasets folder whose NQ-open dev file has ``n`` made-up lines (line 3 repeats line 2's question)."""
    (root / "nq_open").mkdir(parents=True)
    lines = [{"question": f"made up question number {i}", "answer": [f"answer {i}"]} for i in range(n)]
    lines[3]["question"] = lines[2]["question"]
    (root / "nq_open" / "NQ-open.dev.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return root


def _calibration_file(path: Path, nq_lines: list[int], extra_question: str) -> Path:
    rows = [
        {"id": f"nq-{i}", "source": "nq_open", "question": f"made up question number {i}?", "answers": ["x"]} for i in nq_lines
    ]
    rows.append({"id": "tqa-0", "source": "truthfulqa", "question": extra_question, "answers": ["y"]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# -- the shipped file -------------------------------------------------------------------------------------------
def test_schema_and_sizes(items, raw, gen):
    assert default_path().parent == ROOT / "logtoku_guard" / "calibration" / "data"
    assert all(list(r) == list(gen.FIELDS) for r in raw)
    groups = Counter((it.group, it.category) for it in items)
    assert {c for g, c in groups if g == "plausible"} == set(gen.PLAUSIBLE_CATEGORIES)
    assert all(groups[("plausible", c)] == gen.PER_CATEGORY for c in gen.PLAUSIBLE_CATEGORIES)
    assert groups[("real", "nq")] == gen.N_NQ
    assert groups[("real", "known")] == len(gen._fabricated_module().load_candidates())  # every candidate, none filtered
    assert {it.source for it in items} == {"invented", "known_facts", "nq_open"}
    for it in items:
        assert it.question.endswith("?"), it
        if it.group == "plausible":
            assert it.answers == () and len(it.invented) == 1 and it.invented[0] in it.question, it
        else:
            assert it.answers and it.invented == (), it
    assert all(it.id.startswith("nq-") and it.id[3:].isdigit() for it in items if it.category == "nq")
    assert len({it.id for it in items}) == len({it.question for it in items}) == len(items)


def test_every_real_question_is_asked_in_both_styles_with_its_references_and_split(items, gen):
    by_id = {it.id: it for it in items}
    twins = [it for it in items if it.category in gen.RESTYLED.values()]
    originals = [it for it in items if it.category in gen.RESTYLED]
    assert len(twins) == len(originals) - 1  # nq-670 starts with a digit: no cased form
    for twin in twins:
        original = by_id[twin.id.rsplit("-", 1)[0]]
        assert twin.category == gen.RESTYLED[original.category] and twin.question != original.question
        assert (twin.answers, twin.split, twin.source) == (original.answers, original.split, original.source)
        if original.category == "known":
            assert twin.question == original.question.lower()
        else:
            assert twin.question[0].isupper() and twin.question[1:] == original.question[1:]
    assert gen.restyle("Who painted the Mona Lisa?", "known") == "who painted the mona lisa?"
    assert gen.restyle("who sang thriller?", "nq") == "Who sang thriller?"
    with pytest.raises(ValueError, match="'person'"):
        gen.restyle("Who is Anna Holt?", "person")


def test_no_invented_name_is_in_the_stop_list_or_used_twice(items, gen):
    stop = gen.load_stop_list()
    names = [name for it in items for name in it.invented]
    assert names
    assert [n for n in names if gen.stop_hits(n, stop)] == []
    assert [n for n, k in Counter(n.lower() for n in names).items() if k > 1] == []


def test_stop_list_catches_real_names(gen):
    stop = gen.load_stop_list()
    assert gen.stop_hits("the Treaty of Versailles", stop) == ["treaty of versailles", "versailles"]
    assert gen.stop_hits("The Secret Garden of Ashmere", stop) == ["the secret garden"]
    assert gen.stop_hits("What is Lipitor used for?", stop) == ["lipitor"]
    assert gen.stop_hits("Redwater Accord", stop) == []


def test_splits_are_balanced_per_stratum(items):
    tune, test = load_traffic(split="tune"), load_traffic(split="test")
    assert len(tune) + len(test) == len(items) and abs(len(tune) - len(test)) <= 1
    strata = Counter((it.group, it.category) for it in items)
    tune_strata = Counter((it.group, it.category) for it in tune)
    for key, n in strata.items():
        assert tune_strata[key] in (n // 2, n - n // 2), key


def test_no_question_of_the_calibration_set():
    if not CALIBRATION.is_file():
        pytest.skip("the calibration set is not in this tree")
    rows = [json.loads(line) for line in CALIBRATION.read_text(encoding="utf-8").splitlines() if line.strip()]
    items = load_traffic()
    assert {r["id"] for r in rows}.isdisjoint(it.id for it in items)
    assert {r["question"].lower() for r in rows}.isdisjoint(it.question.lower() for it in items)


# -- the generator: deterministic, and it rebuilds the shipped file ------------------------------------------
def test_plausible_and_known_parts_rebuild_the_shipped_file(gen, raw):
    stop, known = gen.load_stop_list(), gen.known_pool_words()
    first = gen.plausible_records(0, stop, known)
    assert first == gen.plausible_records(0, stop, known)
    assert first != gen.plausible_records(1, stop, known)
    rebuilt = first + gen.known_records()
    shipped = [{k: v for k, v in r.items() if k != "split"} for r in raw if r["group"] == "plausible" or r["category"] == "known"]
    twins = gen.restyled_records([r for r in raw if r["category"] in gen.RESTYLED])
    assert twins == [r for r in raw if r["category"] in gen.RESTYLED.values()]
    assert [{k: r[k] for k in gen.FIELDS if k != "split"} for r in rebuilt] == shipped


def test_splits_rebuild_the_shipped_ones(gen, raw):
    records = [{k: v for k, v in r.items() if k != "split"} for r in raw if r["category"] not in gen.RESTYLED.values()]
    raw = [r for r in raw if r["category"] not in gen.RESTYLED.values()]
    gen.assign_splits(records, 0, gen.fabricated_splits())
    assert [r["split"] for r in records] == [r["split"] for r in raw]


def test_known_facts_keep_the_split_of_the_known_vs_fabricated_benchmark(items):
    fabricated = {it.question: it.split for it in load_fabricated() if it.kind == "known"}
    shared = [it for it in items if it.question in fabricated]
    assert len(shared) == len(fabricated)
    assert all(it.split == fabricated[it.question] for it in shared)


def test_nq_sample_avoids_the_calibration_set_and_repeats(gen, tmp_path):
    nq = load_nq_open(data_dir=_nq_folder(tmp_path / "data", 40))
    calibration = gen.read_calibration(_calibration_file(tmp_path / "cal.jsonl", [0, 5, 9], "made up question number 7?"))
    assert calibration.ids == {"nq-0", "nq-5", "nq-9"}
    picked = gen.nq_records(nq, calibration, 30, 0)
    assert picked == gen.nq_records(nq, calibration, 30, 0)
    ids = [r["id"] for r in picked]
    assert len(ids) == 30 and ids == sorted(ids, key=lambda i: int(i[3:]))
    assert {"nq-0", "nq-5", "nq-9", "nq-7", "nq-3"}.isdisjoint(ids)  # 7: same text as a calibration question; 3: a repeat of 2
    assert {r["category"] for r in picked} == {"nq"} and all(r["answers"] for r in picked)
    with pytest.raises(SystemExit, match="only 35 NQ-open questions are eligible"):
        gen.nq_records(nq, calibration, 36, 0)


def test_main_gives_the_same_bytes_for_the_same_seed(gen, tmp_path):
    data = _nq_folder(tmp_path / "data", gen.N_NQ + 20)
    cal = _calibration_file(tmp_path / "cal.jsonl", [1, 2], "Who wrote Hamlet?")
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"]
    for out, seed in zip(outs, ("0", "0", "1")):
        gen.main(["--seed", seed, "--data-dir", str(data), "--calibration", str(cal), "--out", str(out)])
    assert outs[0].read_bytes() == outs[1].read_bytes() != outs[2].read_bytes()
    real = len(gen.known_records()) + gen.N_NQ
    assert len(load_traffic(outs[0])) == len(gen.PLAUSIBLE_CATEGORIES) * gen.PER_CATEGORY + 2 * real  # each real one twice
    with pytest.raises(SystemExit, match="no calibration set"):
        gen.main(["--data-dir", str(data), "--calibration", str(tmp_path / "none.jsonl"), "--out", str(outs[2])])


# -- the loader ----------------------------------------------------------------------------------------------------
GOOD = {
    "id": "known-000",
    "group": "real",
    "category": "known",
    "split": "tune",
    "question": "Who wrote 'Hamlet'?",
    "answers": ["William Shakespeare", "Shakespeare"],
    "source": "known_facts",
    "invented": [],
}
PLAUSIBLE = {**GOOD, "id": "plausible-000", "group": "plausible", "category": "book", "answers": [], "invented": ["X Y"]}


def test_loader_reads_records_and_filters_splits(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({**PLAUSIBLE, "split": "test"}) + "\n", encoding="utf-8")
    items = load_traffic(path)
    assert items[0] == TrafficItem(
        "known-000", "real", "known", "tune", "Who wrote 'Hamlet'?", ("William Shakespeare", "Shakespeare"), "known_facts"
    )
    assert items[1].is_plausible_fabrication and not items[0].is_plausible_fabrication
    assert [it.id for it in load_traffic(path, split="test")] == ["plausible-000"]
    qa = items[0].to_qa_item()
    assert (qa.id, qa.correct, qa.category) == ("known-000", ("William Shakespeare", "Shakespeare"), "real/known")
    assert dataset_name(path).startswith("traffic-") and dataset_name(path) != dataset_name()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a traffic record"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "source"}), "lacks 'source'"),
        (json.dumps({**GOOD, "question": ""}), "'question' must be a non-empty text"),
        (json.dumps({**GOOD, "answers": "Shakespeare"}), "'answers' must be a list of non-empty texts"),
        (json.dumps({**GOOD, "group": "syllable"}), "group must be one of"),
        (json.dumps({**GOOD, "split": "train"}), "split 'tune' or 'test', got 'real' and 'train'"),
        (json.dumps({**GOOD, "answers": []}), "a real question has reference answers"),
        (json.dumps({**PLAUSIBLE, "answers": ["a"]}), "a plausible question has no answers"),
        (json.dumps({**PLAUSIBLE, "invented": []}), "a plausible question has no answers and its invented names"),
        (json.dumps(GOOD), "the id 'known-000' was already used on line 1"),
    ],
)
def test_loader_names_the_bad_line(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"t\.jsonl:2: ") as exc:
        load_traffic(path)
    assert message in str(exc.value)


def test_loader_rejects_bad_arguments(tmp_path):
    with pytest.raises(ConfigurationError, match="split must be one of"):
        load_traffic(split="train")
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_traffic(tmp_path / "missing.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": "\xe9"}\n')
    with pytest.raises(ConfigurationError, match="not UTF-8"):
        load_traffic(tmp_path / "latin1.jsonl")
