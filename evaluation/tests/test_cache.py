"""The generation cache (``evaluation.cache``): round trip, resume, a half-written line, another run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logtoku_eval.cache import CachedGeneration, CachedLabelLogits, CachedToken, CacheMeta, JsonlCache
from logtoku_guard.errors import ConfigurationError


def _record(i: int, n_tokens: int = 2) -> CachedGeneration:
    tokens = tuple(CachedToken(7, " x", (5.0, 4.0, 1.0, 0.5, -2.0), (7, 8, 9, 10, 11), -0.3, 1.2) for _ in range(n_tokens))
    return CachedGeneration(f"id{i}", f"question {i}?", " x" * n_tokens, "stop", tokens)


META = CacheMeta("m", "d", 5, "greedy-max64", "T {question}", "generation")


def test_cache_round_trip_and_resume(tmp_path: Path) -> None:
    cache = JsonlCache.in_dir(tmp_path, META, CachedGeneration)
    cache.append([_record(0), _record(1, 0)])
    again = JsonlCache.in_dir(tmp_path, META, CachedGeneration)
    assert again.done_ids() == {"id0", "id1"}
    assert again.get("id0") == _record(0) and again.get("id1") == _record(1, 0)
    assert [r.id for r in again.records(["id1", "missing", "id0"])] == ["id1", "id0"]


def test_cache_cuts_a_half_written_line(tmp_path: Path) -> None:
    cache = JsonlCache.in_dir(tmp_path, META, CachedGeneration)
    cache.append([_record(0)])
    with open(cache.path, "a", encoding="utf-8") as fh:
        fh.write('{"id": "id1", "quest')  # killed mid-write
    again = JsonlCache.in_dir(tmp_path, META, CachedGeneration)
    assert again.done_ids() == {"id0"}
    again.append([_record(2)])
    lines = cache.path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line) for line in lines)


def test_cache_refuses_another_run(tmp_path: Path) -> None:
    JsonlCache(tmp_path / "c.jsonl", META, CachedGeneration)
    other = CacheMeta("m", "d", 2, "greedy-max64", "T {question}", "generation")
    with pytest.raises(ConfigurationError, match="k_stored") as info:
        JsonlCache(tmp_path / "c.jsonl", other, CachedGeneration)
    # the generation cache is eval's --gen-cache-dir (--cache-dir is the model cache elsewhere)
    assert "(CLI: eval --gen-cache-dir; Python: cache_dir=)" in str(info.value) and "--cache-dir" not in str(info.value)
    with pytest.raises(ConfigurationError, match="record"):
        JsonlCache(tmp_path / "d.jsonl", META, CachedLabelLogits)


@pytest.mark.parametrize(
    "bad",
    [b'{"id": "id1", "question": "broken\n', b"\xff\xfe not utf-8\n", b'{"id": "id1"}\n', b"[1, 2]\n"],
    ids=["not-json", "not-utf8", "missing-fields", "not-an-object"],
)
def test_a_corrupt_line_names_the_file_the_line_and_the_fix_and_loses_nothing(tmp_path: Path, bad: bytes) -> None:
    cache = JsonlCache.in_dir(tmp_path, META, CachedGeneration)
    cache.append([_record(0)])
    with open(cache.path, "ab") as fh:
        fh.write(bad)
    cache.append([_record(2)])  # written by the still-open writer after the damage: line 4
    before = cache.path.read_bytes()
    with pytest.raises(ConfigurationError) as info:
        JsonlCache.in_dir(tmp_path, META, CachedGeneration)
    msg = str(info.value)
    assert str(cache.path) in msg and "line 3" in msg and "delete that line" in msg and "resumable" in msg
    assert cache.path.read_bytes() == before  # nothing rewritten, no line lost
    # the fix works: drop line 3 and every other record is there
    lines = before.split(b"\n")
    cache.path.write_bytes(b"\n".join(lines[:2] + lines[3:]))
    assert JsonlCache.in_dir(tmp_path, META, CachedGeneration).done_ids() == {"id0", "id2"}


def test_a_corrupt_header_and_an_answer_with_a_line_separator(tmp_path: Path) -> None:
    path = tmp_path / META.filename
    path.write_bytes(b"not json\n")
    with pytest.raises(ConfigurationError, match=r"line 1: not the cache header.*delete the cache file"):
        JsonlCache.in_dir(tmp_path, META, CachedGeneration)
    path.unlink()
    cache = JsonlCache.in_dir(tmp_path, META, CachedGeneration)
    odd = CachedGeneration("u", "q?", "one\u2028two\x85three", "stop", ())
    cache.append([odd])  # json.dumps keeps U+2028 and U+0085 raw: lines split on "\n" only
    assert JsonlCache.in_dir(tmp_path, META, CachedGeneration).get("u") == odd
