"""Dataset loaders (``evaluation.datasets``): read in place, errors that name the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from logtoku_eval.datasets import (
    DatasetUnavailableError,
    load_emotion_names,
    load_goemotions,
    load_nq_open,
    load_truthfulqa,
)
from logtoku_guard.errors import ConfigurationError, LogTokUError

from .support import make_data_dir


def test_loaders_read_in_place(tmp_path: Path) -> None:
    root = make_data_dir(tmp_path / "data")
    tqa = load_truthfulqa(data_dir=root)
    assert [i.id for i in tqa] == ["tqa-0", "tqa-1", "tqa-2", "tqa-3"]
    assert tqa[0].question == "What is the capital of France?"  # the BOM is not part of the header
    assert tqa[0].correct == ("Paris", "The capital is Paris")  # best answer first, deduplicated
    assert tqa[0].incorrect == ("Lyon", "Marseille")
    assert len(load_truthfulqa(data_dir=root, limit=2)) == 2
    nq = load_nq_open(data_dir=root)
    assert nq[0].question == "who wrote hamlet?" and nq[0].correct == ("Shakespeare",)
    assert load_emotion_names(root) == ["capital", "text", "unicode", "model"]
    dev = load_goemotions("dev", data_dir=root)
    assert dev[0].labels == (0, 1) and dev[1].labels == (1,) and dev[0].id == "dev0"
    with pytest.raises(DatasetUnavailableError, match="not found"):
        load_truthfulqa(data_dir=tmp_path / "data" / "nowhere")
    with pytest.raises(ConfigurationError, match="limit"):
        load_truthfulqa(data_dir=root, limit=0)


def test_errors_share_the_library_root() -> None:
    assert issubclass(DatasetUnavailableError, LogTokUError)


def test_data_dir_is_the_argument_then_the_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from logtoku_eval.datasets import DATA_ENV, data_root, default_data_dir, existing_data_dir

    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv(DATA_ENV, str(root))
    assert default_data_dir() == root and existing_data_dir() == root and data_root() == root
    assert [i.id for i in load_truthfulqa(limit=2)] == ["tqa-0", "tqa-1"]  # no argument: the variable
    assert data_root(tmp_path) == tmp_path  # an argument wins over the variable
    # the variable is used as given: a wrong folder is an error naming it, never a silent fallback
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "missing"))
    assert existing_data_dir() is None
    with pytest.raises(DatasetUnavailableError, match=r"missing.*LOGTOKU_GUARD_DATA"):
        load_nq_open()


def test_calibration_prompts_read_through_the_loaders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from logtoku_guard.calibration import default_calibration_prompts

    root = make_data_dir(tmp_path / "data")
    # half from TruthfulQA (every 2nd of 4 rows), half from NQ-open (one line, "?" appended)
    assert default_calibration_prompts(4, root) == [
        "What is the capital of France?",
        "Is 2+2 equal to 4?",
        "who wrote hamlet?",
    ]
    with pytest.raises(DatasetUnavailableError, match="own prompts file"):
        default_calibration_prompts(4, tmp_path / "nowhere")


def test_without_a_folder_the_datasets_ask_for_one_and_never_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    """No --data-dir and no variable: a message naming both ways, never a folder guessed beside the package."""
    monkeypatch.delenv("LOGTOKU_GUARD_DATA", raising=False)
    with pytest.raises(DatasetUnavailableError, match=r"\(CLI: eval --data-dir; Python: data_dir=\) or set \$LOGTOKU_GUARD_DATA"):
        load_truthfulqa(limit=3)


def test_malformed_dataset_files_name_the_file_the_line_and_the_format(tmp_path: Path) -> None:
    nq = tmp_path / "nq.jsonl"
    good = '{"question": "who?", "answer": ["me"]}\n'
    for bad, what in [
        ('{"question": "broken\n', "not JSON"),
        ('{"question": "no answer"}\n', 'got \'{"question": "no answer"}\''),
        ('{"question": "q", "answer": "not a list"}\n', "'answer' (a list of texts)"),
        ("[1, 2]\n", "got '[1, 2]'"),
    ]:
        nq.write_text(good + bad, encoding="utf-8")
        with pytest.raises(ConfigurationError) as info:
            load_nq_open(nq)
        assert f"{nq}:2" in str(info.value) and what in str(info.value), str(info.value)
    nq.write_bytes(good.encode() + b"caf\xe9\n")
    with pytest.raises(ConfigurationError, match=r"nq\.jsonl:2: not UTF-8 text \(byte 0xe9\)"):
        load_nq_open(nq)
    assert load_nq_open(nq, limit=1)[0].correct == ("me",)  # lines before the damage still read

    tqa = tmp_path / "tqa.csv"
    tqa.write_text("Question,Best Answer\nWhat?,This\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"tqa.csv, row 1: missing or empty column.*'Correct Answers'"):
        load_truthfulqa(tqa)
    tqa.write_bytes(b"Question,Best Answer,Correct Answers,Incorrect Answers\nWh\xffat?,a,b,c\n")
    with pytest.raises(ConfigurationError, match=r"tqa\.csv' is not UTF-8"):
        load_truthfulqa(tqa)

    root = make_data_dir(tmp_path / "data")
    (root / "goemotions" / "dev.tsv").write_text("a comment\tjoy\tc1\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"dev.tsv:1: label ids are not integers"):
        load_goemotions("dev", data_dir=root)
    (root / "goemotions" / "emotions.txt").write_bytes(b"\xff\n")
    with pytest.raises(ConfigurationError, match=r"emotions\.txt' is not UTF-8"):
        load_emotion_names(root)
