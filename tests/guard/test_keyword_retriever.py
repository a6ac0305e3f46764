"""KeywordRetriever: BM25 ranking over a fixed list of passages, validation, passages from a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from logtoku_guard import ConfigurationError, KeywordRetriever

PASSAGES = ["Paris is the capital of France.", "The Zarnovian Institute was founded by Paris.", "Bananas are yellow."]


def test_ranks_matching_passages_and_drops_the_rest() -> None:
    r = KeywordRetriever(PASSAGES)
    found = r.retrieve("Who founded the Zarnovian Institute?")
    assert found[0] == PASSAGES[1]
    assert PASSAGES[2] not in found  # no shared word: never returned
    assert r.retrieve("quantum chromodynamics") == []


def test_k_limits_the_number_of_passages() -> None:
    assert len(KeywordRetriever(PASSAGES, k=1).retrieve("Paris")) == 1
    assert len(KeywordRetriever(PASSAGES, k=4).retrieve("Paris")) == 2


def test_validation_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="at least one non-empty passage"):
        KeywordRetriever(["", "  "])
    with pytest.raises(ConfigurationError, match="k must be >= 1"):
        KeywordRetriever(PASSAGES, k=0)
    with pytest.raises(ConfigurationError, match="does not exist"):
        KeywordRetriever.from_file(tmp_path / "missing.txt")


def test_from_file_splits_on_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "kb.txt"
    path.write_text("\n\n".join(PASSAGES) + "\n", encoding="utf-8")
    r = KeywordRetriever.from_file(path, k=2)
    assert r.passages == PASSAGES and r.k == 2


def test_from_file_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "kb.txt"
    bad.write_bytes(b"caf\xe9 au lait\n")
    with pytest.raises(
        ConfigurationError, match=r"kb.txt' is not valid UTF-8: byte b'\\xe9' at offset 3 .*save the file as UTF-8"
    ):
        KeywordRetriever.from_file(bad)
    with pytest.raises(ConfigurationError, match="is a folder, not a file; give a regular file"):
        KeywordRetriever.from_file(tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_named_pipe_or_a_device_is_refused_before_any_read(tmp_path: Path, kind: str) -> None:
    """F15/F16: reading a FIFO blocked forever, /dev/zero grew without end; both are refused at once."""
    import os

    from logtoku_guard.calibration.guard_fit import read_labels
    from logtoku_guard.decision.policy_loading import read_policy_file
    from logtoku_guard.errors import PolicyError

    if kind == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)
        expected = "is a named pipe (FIFO), not a file"
    else:
        path = Path("/dev/zero")
        expected = "is a device, not a file"
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        KeywordRetriever.from_file(path)
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        read_labels(path)
    with pytest.raises(PolicyError, match=re.escape(expected)):
        read_policy_file(path)
