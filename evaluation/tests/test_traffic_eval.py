"""eval traffic: outcomes judged per group, the guard fit and its threshold chosen on tune only,
flag rates per group on test, and the CLI reading its caches (synthetic answers, no model)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from logtoku_eval.cache import CachedGeneration, CachedToken
from logtoku_eval.cli import eval_app
from logtoku_eval.traffic_eval import (
    OUTCOMES,
    RISK_TARGETS,
    RiskCheck,
    TrafficQuestion,
    choose_threshold,
    evaluate_traffic,
    judge_answers,
    traffic_questions,
)
from logtoku_guard.backends.embedded import EMBEDDED_MODEL

from .support import HAS_MPL


def _tok(text: str, peak: float, rng: random.Random) -> CachedToken:
    top = sorted((rng.gauss(0, 0.5) + (peak if i == 0 else 0.0) for i in range(5)), reverse=True)
    return CachedToken(
        id=rng.randrange(100), text=text, top_logits=tuple(top), top_ids=(1, 2, 3, 4, 5), logprob=-1 / peak, entropy=1.0
    )


def record(rid: str, question: str, answer: str, peak: float) -> CachedGeneration:
    """An answer whose claim words (the last two) have logits peaked at ``peak``; the template words are sure."""
    rng = random.Random(rid)
    words = answer.split()
    toks = tuple(_tok((" " if i else "") + w, 9.0 if i < len(words) - 2 else peak, rng) for i, w in enumerate(words))
    prompt = tuple(_tok((" " if i else "") + w, 6.0, rng) for i, w in enumerate(question.split()))
    return CachedGeneration(rid, question, answer, "stop", toks, prompt)


def synthetic(n: int = 40) -> list[tuple[TrafficQuestion, CachedGeneration]]:
    """Right answers are sure of their claim, wrong and invented ones are not (groups alternate halves)."""
    pairs = []
    for i in range(n):
        split = "tune" if i % 2 == 0 else "test"
        category = ("known", "known-lower", "nq", "nq-cased")[(i // 2) % 4]
        q = TrafficQuestion(f"r{i}", "real", category, split, f"Who wrote book {i}?", (f"Author{i}",))
        right = i % 3 != 0
        answer = f"It was written by Author{i} Smith" if right else f"It was written by Someone{i} Else"
        pairs.append((q, record(q.id, q.question, answer, 7.0 + random.Random(i).uniform(-1, 1) if right else 1.5)))
        for group in ("plausible", "syllable"):
            f = TrafficQuestion(f"{group[0]}{i}", group, "person", split, f"Who founded the Halden Institute {i}?", ())
            pairs.append(
                (f, record(f.id, f.question, f"It was founded by Anna{i} Holt", 1.2 + random.Random(f.id).uniform(0, 1)))
            )
    return pairs


def test_outcomes_judge_real_answers_and_never_credit_an_invented_thing() -> None:
    answers = judge_answers(synthetic(6))
    got = {a.question.id: a.outcome for a in answers}
    assert got["r1"] == "real-correct" and got["r0"] == "real-wrong" and got["p0"] == "plausible" and got["s0"] == "syllable"
    assert [a.correct for a in answers if a.question.group != "real"] == [False] * 12


def test_the_threshold_passes_the_target_share_of_correct_answers() -> None:
    scores = np.arange(1, 21, dtype=float) / 20
    t = choose_threshold(scores, 0.85)
    assert np.mean(scores >= t) >= 0.85 and np.mean(scores >= np.nextafter(t, 2)) < 0.85
    assert np.isnan(choose_threshold(np.array([np.nan]), 0.85))


def test_evaluate_fits_on_tune_and_reports_every_group_on_test() -> None:
    answers = judge_answers(synthetic(60))
    calibration = [record(f"c{i}", f"Calibration question {i}?", f"The answer is Value{i} Now", 1.0 + i / 5) for i in range(30)]
    report = evaluate_traffic(answers, calibration, model="m", n_boot=50)
    assert set(report.feature_sets) >= {"answer+prompt", "answer+prompt+claim"} and report.chosen in report.feature_sets
    assert report.guard.datasets == ["traffic-tune"] and report.guard.n == sum(report.counts["tune"].values())
    assert set(report.test_rates) == set(OUTCOMES) and report.counts["test"]["real-correct"] > 0
    # the synthetic claims separate the groups: correct answers pass, the rest is flagged
    assert report.test_rates["real-correct"].value <= 0.3 and report.test_rates["plausible"].value >= 0.9
    assert 0.0 <= report.quantile <= 1.0 and report.curve
    categories = {"known", "known-lower", "nq", "nq-cased", "style cased", "style lower"}
    assert set(report.by_category) == {f"{o} / {c}" for o in ("real-correct", "real-wrong") for c in categories}
    cased = report.by_category["real-wrong / style cased"]
    assert cased.n == report.by_category["real-wrong / known"].n + report.by_category["real-wrong / nq-cased"].n
    assert set(report.by_style) == {"cased", "lower"} and all(v[0] > 0.8 for v in report.by_style.values())
    # each stated-risk target chosen on tune, measured on test; the synthetic groups separate, so each promise holds
    assert [(c.chosen.kind, c.chosen.target) for c in report.risk_checks] == [(k, t) for k, t, _ in RISK_TARGETS]
    coverage = report.risk_checks[0]
    correct = report.counts["test"]["real-correct"]
    assert coverage.test.n == correct and coverage.chosen.met and coverage.holds
    assert "| coverage >= 80% at 90% |" in report.to_markdown()
    assert report.contrasts["real-correct vs plausible"]["claim_min_logprob"][0] > 0.9
    md = report.to_markdown()
    assert "| plausible | flag |" in md and "claim_max_eu" in md
    json.dumps(report.to_json(), allow_nan=True)


def test_a_risk_check_holds_only_when_the_test_half_does_not_contradict_it() -> None:
    from logtoku_eval.traffic_eval import Rate
    from logtoku_guard.scoring.risk import choose_threshold as choose_risk

    chosen = choose_risk([0.5 + i / 400 for i in range(200)], [i / 400 for i in range(100)], "coverage", 0.8, 0.9)
    assert chosen.met
    assert RiskCheck(chosen, Rate(0.82, 0.76, 0.88, 100)).holds
    assert RiskCheck(chosen, Rate(0.78, 0.70, 0.85, 100)).holds  # below the target, but inside its interval
    assert not RiskCheck(chosen, Rate(0.70, 0.61, 0.79, 100)).holds  # the test half contradicts the promise
    risk = choose_risk([0.5 + i / 400 for i in range(200)], [i / 400 for i in range(100)], "selective_risk", 0.2, 0.9)
    assert RiskCheck(risk, Rate(0.1, 0.05, 0.15, 150)).holds and not RiskCheck(risk, Rate(0.3, 0.22, 0.38, 150)).holds


def test_the_shipped_questions_hold_every_group_in_both_halves() -> None:
    questions = traffic_questions()
    for group in ("real", "plausible", "syllable"):
        for split in ("tune", "test"):
            assert any(q.group == group and q.split == split for q in questions), (group, split)
    assert len({q.id for q in questions}) == len(questions)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "name"),
    [("transformers", EMBEDDED_MODEL), ("llamacpp", f"{EMBEDDED_MODEL}-f16@llamacpp")],  # llama.cpp's default: F16
)
def test_cli_eval_traffic_reads_its_caches_and_writes_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, name: str
) -> None:
    """Every answer already cached under the backend's model name: the CLI loads no model, fits,
    and writes traffic.md/json and the guard."""
    monkeypatch.delenv("LOGTOKU_GUARD_LLAMACPP_WEIGHTS", raising=False)
    from logtoku_eval.generate import SERVING, SERVING_TEMPLATE, greedy_cache
    from logtoku_eval.traffic import dataset_name
    from logtoku_guard.calibration.prompts import shipped_calibration_questions

    questions = traffic_questions()
    rng = random.Random(0)
    caches = {
        "traffic": greedy_cache(tmp_path / "gen", name, dataset_name(), SERVING, template=SERVING_TEMPLATE),
        "syllable": greedy_cache(tmp_path / "gen", name, "traffic-syllable", SERVING, template=SERVING_TEMPLATE),
        "calibration": greedy_cache(tmp_path / "gen", name, "calibration-default", SERVING, template=SERVING_TEMPLATE),
    }
    for q in questions:
        right = q.group == "real" and rng.random() < 0.6
        text = f"The answer is {q.answers[0]}" if right else "The answer is Nobody Knows"
        caches["syllable" if q.group == "syllable" else "traffic"].append([record(q.id, q.question, text, 7.0 if right else 1.5)])
    caches["calibration"].append(record(c.id, c.question, "It is Some Thing", 3.0) for c in shipped_calibration_questions())
    monkeypatch.setattr("logtoku_eval.cli.common.backend_loader", lambda *a: pytest.fail("no model may load"))
    out = tmp_path / "out"
    args = [
        "traffic",
        "--backend",
        backend,
        "--gen-cache-dir",
        str(tmp_path / "gen"),
        "--out-dir",
        str(out),
        "--n-boot",
        "20",
    ]
    res = CliRunner().invoke(eval_app, [*args, *([] if HAS_MPL else ["--no-plots"])])
    assert res.exit_code == 0, res.output
    assert (out / "traffic-trade-off.png").is_file() == HAS_MPL
    assert "real-wrong" in res.output and (out / "traffic.md").is_file()
    payload = json.loads((out / "traffic.json").read_text())
    assert set(payload["test_rates"]) == set(OUTCOMES)
    assert json.loads((out / "traffic-guard.json").read_text())["datasets"] == ["traffic-tune"]
    bad = CliRunner().invoke(eval_app, ["traffic", "--pass-target", "1.5", "--gen-cache-dir", str(tmp_path / "gen")])
    assert bad.exit_code == 2 and "--pass-target 1.5" in bad.output
