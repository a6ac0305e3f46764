"""The generation cache (``evaluation.cache``): round trip, resume, a half-written line, another run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.evaluation.cache import CachedGeneration, CachedLabelLogits, CachedToken, CacheMeta, JsonlCache


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
    with pytest.raises(ConfigurationError, match="k_stored"):
        JsonlCache(tmp_path / "c.jsonl", other, CachedGeneration)
    with pytest.raises(ConfigurationError, match="record"):
        JsonlCache(tmp_path / "d.jsonl", META, CachedLabelLogits)
