"""Dynamic decoding on GoEmotions (``evaluation.dynamic``): label statistics, rules, label logits."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tiny import make_model

from logtoku_eval.datasets import load_emotion_names, load_goemotions
from logtoku_eval.dynamic import (
    collect_label_logits,
    decide,
    evaluate_rules,
    label_cache,
    label_stats,
    label_tokens,
    paper_score,
    tune_threshold,
)
from logtoku_guard.errors import ConfigurationError

from .support import make_data_dir


def test_label_stats_and_paper_score_hand_computed() -> None:
    st = label_stats(np.array([[3.0, 1.0, 0.5], [0.0, 5.0, -1.0]]))
    assert st.first.tolist() == [0, 1] and st.second.tolist() == [1, 0]
    assert st.logtoku[0] == pytest.approx(0.333333 / 0.458333, rel=1e-5)  # u = EU / AU of (3, 1)
    assert math.isinf(st.logtoku[1])  # AU = 0: never adds a label
    p = np.exp([3.0, 1.0, 0.5]) / np.exp([3.0, 1.0, 0.5]).sum()
    assert st.probability[0] == pytest.approx(p[1])
    assert st.entropy[0] == pytest.approx(-(p * np.log(p)).sum())
    assert paper_score([[1, 2], [1], [3], [1, 2]], [[1], [1, 2], [1], [1, 2]]).tolist() == [0, 1, 0, 2]
    assert decide(st, "greedy") == [[0], [1]] and decide(st, "top-2") == [[0, 1], [1, 0]]
    assert decide(st, "logtoku", 1.0) == [[0, 1], [1]]


def test_threshold_is_tuned_on_dev() -> None:
    # Two-label gold exactly where the runner-up is close: every rule can find it.
    logits = np.array([[5.0, 4.9, 0.0], [5.0, 0.5, 0.0], [4.0, 3.9, 0.0], [6.0, 0.2, 0.0]])
    gold = [[0, 1], [0], [0, 1], [0]]
    st = label_stats(logits)
    for rule in ("logtoku", "probability", "entropy"):
        t, score = tune_threshold(st, gold, rule)  # type: ignore[arg-type]
        assert score == 1.5, rule
        assert paper_score(decide(st, rule, t), gold).mean() == 1.5  # type: ignore[arg-type]
    res = {r.rule: r for r in evaluate_rules(logits, gold, logits, gold)}
    assert res["greedy"].test_score == 1.0 and res["top-2"].test_score == 1.0
    assert res["logtoku"].test_score == 1.5 and res["logtoku"].test_two_label_share == 0.5
    assert res["logtoku"].test_auroc_second == 1.0 and res["probability"].test_auroc_second == 1.0
    assert math.isnan(res["greedy"].test_auroc_second)


def test_label_tokens_map_and_clash(tiny_tokenizer: Any) -> None:
    m = label_tokens(tiny_tokenizer, ["capital", "text", "unicode"])
    assert len(set(m.token_ids)) == 3 and all(m.single_token)
    with pytest.raises(ConfigurationError, match="share a first token"):
        label_tokens(tiny_tokenizer, ["capital", "capitals"])


def test_label_logits_on_the_tiny_model(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from logtoku_guard.backends.transformers import TransformersBackend

    root = make_data_dir(tmp_path / "data")
    names = load_emotion_names(root)
    backend = TransformersBackend("tiny", model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer)
    items = load_goemotions("dev", data_dir=root)
    cache = label_cache(tmp_path / "cache", "tiny", "dev", names)
    recs = collect_label_logits(backend, items, names, cache, batch_size=4)
    assert len(recs) == 6 and all(len(r.logits) == 4 for r in recs)
    # Left padding does not change a row's logits: the same comment alone gives the same values.
    alone = collect_label_logits(backend, items[:1], names, label_cache(tmp_path / "c2", "tiny", "dev", names), batch_size=1)
    assert alone[0].logits == pytest.approx(recs[0].logits, abs=1e-4)
    # Cached: a second call generates nothing (a backend without a model would fail).
    assert collect_label_logits(None, items, names, label_cache(tmp_path / "cache", "tiny", "dev", names)) == recs


def test_ekman_grouping_maps_gold_labels() -> None:
    from logtoku_eval.datasets import EmotionItem
    from logtoku_eval.dynamic import EKMAN, to_ekman

    fine = [f for fs in EKMAN.values() for f in fs]
    items = [EmotionItem("a", "t", (fine.index("gratitude"), fine.index("love"))), EmotionItem("b", "t", (fine.index("grief"),))]
    names, mapped = to_ekman(items, fine)
    assert names == ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
    assert mapped[0].labels == (3,) and mapped[1].labels == (4,)
    with pytest.raises(ConfigurationError, match="Ekman"):
        to_ekman(items, ["joy"])
