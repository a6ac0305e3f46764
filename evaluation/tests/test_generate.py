"""Greedy generation into the cache (``evaluation.generate``): interruption and resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from logtoku_eval.datasets import QAItem
from logtoku_eval.generate import greedy_cache, run_greedy
from logtoku_guard.backends.fake import ScriptedBackend
from logtoku_guard.errors import ConfigurationError

from .support import ITEM, qa_backend


def test_interrupted_generation_resumes_where_it_stopped(tmp_path: Path) -> None:
    items = [QAItem(f"q{i}", f"What is the capital {i}?", ("Paris",)) for i in range(5)]
    cache = greedy_cache(tmp_path, "scripted", "toy")
    calls: list[str] = []
    backend = qa_backend(calls)

    class Dies:
        k = 5
        model_name = "scripted"

        def __init__(self) -> None:
            self.n = 0

        def batch(self, prompts: Any, options: Any = None) -> Any:
            self.n += 1
            if self.n > 1:
                raise KeyboardInterrupt
            return backend.batch(prompts, options)

    with pytest.raises(KeyboardInterrupt):
        run_greedy(Dies(), items, cache, batch_size=2)
    assert greedy_cache(tmp_path, "scripted", "toy").done_ids() == {"q0", "q1"}
    calls.clear()
    seen: list[int] = []
    done = run_greedy(backend, items, greedy_cache(tmp_path, "scripted", "toy"), batch_size=2, on_progress=seen.append)
    assert len(calls) == 3 and [r.id for r in done] == [f"q{i}" for i in range(5)]
    assert seen == [2, 2, 1]  # 2 already cached, then two batches


def test_greedy_needs_a_backend_storing_k5(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="k=5"):
        run_greedy(ScriptedBackend([], k=2), [ITEM], greedy_cache(tmp_path, "scripted", "toy"))
