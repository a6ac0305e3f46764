"""``logtoku-guard eval`` (``evaluation.cli``) from filled caches; registering it imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from logtoku_eval.cache import CachedLabelLogits
from logtoku_eval.datasets import load_emotion_names, load_goemotions, load_nq_open, load_truthfulqa
from logtoku_eval.dynamic import label_cache
from logtoku_eval.generate import greedy_cache, run_greedy
from logtoku_eval.methods import HEADLINE
from logtoku_eval.rag import GuardEvalConfig, run_guard_eval
from logtoku_guard.backends.fake import ScriptedBackend

from .support import make_data_dir, nq_items, nq_script, qa_backend


@pytest.mark.parametrize("module", ["logtoku_guard.cli", "logtoku_eval.cli"])
def test_cli_registration_imports_no_heavy_dependency(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_logtoku_guard_eval_is_found_through_the_entry_point_the_distribution_registers(tmp_path: Path) -> None:
    """The core CLI finds ``eval`` through installed metadata (here a dist-info folder written as
    ``pip install`` writes it, with this distribution's own entry point), not through an import."""
    import os

    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "evaluation" / "pyproject.toml").read_text())
    group = pyproject["project"]["entry-points"]["logtoku_guard.cli"]
    assert group == {"eval": "logtoku_eval.cli:eval_app"}
    info = tmp_path / "site" / "logtoku_guard_eval-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: logtoku-guard-eval\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[logtoku_guard.cli]\n" + "".join(f"{k} = {v}\n" for k, v in group.items()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}
    res = subprocess.run([sys.executable, "-m", "logtoku_guard.cli", "eval", "--help"], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert all(c in res.stdout for c in ("truthfulqa", "nq-open", "dynamic-decoding", "guard", "fabricated", "traffic"))


def test_cli_truthfulqa_rescoring_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    root = make_data_dir(tmp_path / "data")
    items = load_truthfulqa(data_dir=root)
    run_greedy(qa_backend([]), items, greedy_cache(tmp_path / "cache", "scripted-model", "truthfulqa"))
    args = [
        "truthfulqa",
        "--model",
        "scripted-model",
        "--data-dir",
        str(root),
        "--gen-cache-dir",
        str(tmp_path / "cache"),
    ]
    args += ["--out-dir", str(tmp_path / "out"), "--samples-limit", "0", "--judge", "rouge", "--n-boot", "20", "--no-plots"]
    res = CliRunner().invoke(eval_app, args)
    assert res.exit_code == 0, res.output
    assert "rouge-l-rule" in res.output and HEADLINE in res.output
    assert (tmp_path / "out" / "truthfulqa.json").exists()
    # 4 answers, 2 right: every fold's training part has fewer than 2 of a class -> NaN with the reason
    assert "| guard-score | logtoku |" in res.output and "Scored NaN: fold 0" in res.output
    off = CliRunner().invoke(eval_app, [*args, "--guard-folds", "0"])
    assert off.exit_code == 0, off.output
    assert "| guard-score |" not in off.output and "cross-fitted" not in off.output
    one = CliRunner().invoke(eval_app, [*args, "--guard-folds", "1"])
    assert one.exit_code == 2 and "--guard-folds 1" in one.output and "at least 2" in one.output
    bad = CliRunner().invoke(eval_app, ["truthfulqa", "--data-dir", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2


def test_cli_help_documents_guard_folds() -> None:
    from typer.main import get_command
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    commands = get_command(eval_app).commands  # type: ignore[attr-defined]
    for command in ("truthfulqa", "nq-open", "guard"):
        res = CliRunner().invoke(eval_app, [command, "--help"])
        assert res.exit_code == 0 and "--guard-folds" in res.output, res.output
        option = next(p for p in commands[command].params if p.name == "guard_folds")
        assert option.default == 5 and "0 = off" in option.help and "never on its own" in option.help


def test_cli_dynamic_decoding_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    root = make_data_dir(tmp_path / "data")
    names = load_emotion_names(root)
    rng = np.random.default_rng(0)
    for split in ("dev", "test"):
        cache = label_cache(tmp_path / "cache", "m", split, names)
        cache.append(CachedLabelLogits(it.id, tuple(rng.normal(3, 1, 4))) for it in load_goemotions(split, data_dir=root))
    args = ["dynamic-decoding", "--model", "m", "--data-dir", str(root), "--gen-cache-dir", str(tmp_path / "cache")]
    res = CliRunner().invoke(eval_app, [*args, "--out-dir", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "u = EU/AU < t" in res.output
    data = json.loads((tmp_path / "out" / "goemotions.json").read_text())
    assert [r["rule"] for r in data["rules"]] == ["greedy", "top-2", "logtoku", "probability", "entropy"]


def test_cli_eval_writes_under_the_user_cache_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --gen-cache-dir/--out-dir nothing is written to the working folder."""
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    root = make_data_dir(tmp_path / "data")
    names = load_emotion_names(root)
    cache_root = tmp_path / "user-cache"
    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(cache_root))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    rng = np.random.default_rng(0)
    for split in ("dev", "test"):
        cache = label_cache(cache_root / "eval" / "generations", "m", split, names)
        cache.append(CachedLabelLogits(it.id, tuple(rng.normal(3, 1, 4))) for it in load_goemotions(split, data_dir=root))
    res = CliRunner().invoke(eval_app, ["dynamic-decoding", "--model", "m", "--data-dir", str(root)])
    assert res.exit_code == 0, res.output
    assert (cache_root / "eval" / "results" / "goemotions.json").exists()
    assert list(work.iterdir()) == []


def test_cli_eval_help_and_the_renamed_generation_cache_option() -> None:
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    res = CliRunner().invoke(eval_app, ["--help"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "fabricated" in text and "guard" in text and "spec" not in text.lower()
    for command in ("truthfulqa", "nq-open", "dynamic-decoding", "guard", "fabricated"):
        sub = " ".join(CliRunner().invoke(eval_app, [command, "--help"]).output.split())
        assert "--gen-cache-dir" in sub and "spec section" not in sub, sub
    old = CliRunner().invoke(eval_app, ["fabricated", "--cache-dir", "x"])
    assert old.exit_code == 2 and "--cache-dir" in old.output


@pytest.mark.parametrize(
    ("args", "piece"),
    [
        (["fabricated", "--n-boot", "0"], "--n-boot 0"),
        (["fabricated", "--n-boot", "10000000000"], "--n-boot 10000000000"),
        (["nq-open", "--seed", "18446744073709551616"], "--seed 18446744073709551616"),
        (["nq-open", "--samples-limit", "-1"], "--samples-limit -1"),
        (["truthfulqa", "--n-samples", "1", "--samples-limit", "3"], "--n-samples 1"),
        (["guard", "--live", "-1"], "--live"),
        (["dynamic-decoding", "--batch-size", "0"], "--batch-size 0"),
    ],
)
def test_cli_eval_counts_are_checked_before_anything_loads(args: list[str], piece: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    res = CliRunner().invoke(eval_app, [*args, "--out-dir", str(tmp_path / "o")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and piece in text and "Traceback" not in text, text
    assert not (tmp_path / "o").exists()


def test_cli_guard_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    data = tmp_path / "data" / "nq_open"
    data.mkdir(parents=True)
    rows = [{"question": it.question.rstrip("?"), "answer": list(it.correct)} for it in nq_items(20)]
    (data / "NQ-open.dev.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")

    pool = load_nq_open(data_dir=tmp_path / "data")
    run_guard_eval(
        pool[:6], pool, "scripted-model", ScriptedBackend(nq_script([]), k=5), GuardEvalConfig(cache_dir=tmp_path / "c", live=0)
    )
    args = ["guard", "--model", "scripted-model", "--data-dir", str(tmp_path / "data"), "--limit", "6"]
    args += [
        "--gen-cache-dir",
        str(tmp_path / "c"),
        "--out-dir",
        str(tmp_path / "out"),
        "--live",
        "0",
        "--n-boot",
        "20",
        "--no-plots",
    ]
    res = CliRunner().invoke(eval_app, args)
    assert res.exit_code == 0, res.output
    assert "always retrieve" in res.output and (tmp_path / "out" / "guard-e2e.json").exists()
    assert "| guard-score | 0.3 |" in res.output and "| 0.3 | guard-score | random |" in res.output
    off = CliRunner().invoke(eval_app, [*args, "--guard-folds", "0"])
    assert off.exit_code == 0 and "guard-score" not in off.output
    bad = CliRunner().invoke(eval_app, [*args, "--budgets", "0,1.5"])
    assert bad.exit_code == 2 and "1.5" in bad.output
    bad = CliRunner().invoke(eval_app, [*args, "--passages", "0"])
    assert bad.exit_code == 2 and "--passages" in bad.output


def test_cli_nq_open_with_a_bad_jsonl_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    bad = tmp_path / "nq.jsonl"
    bad.write_text('{"question": "who?", "answer": ["me"]}\n{"question": "broken\n')
    res = CliRunner().invoke(eval_app, ["nq-open", "--path", str(bad), "--gen-cache-dir", str(tmp_path / "c")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    flat = "".join(res.output.split())  # the message wraps at the terminal's width, wherever the path falls
    assert "nq.jsonl" in flat and "JSON" in flat


FIVE = [9.0, 1.0, 0.5, 0.2, 0.1]


@pytest.mark.parametrize("command", ["truthfulqa", "nq-open", "guard", "fabricated", "traffic"])
def test_every_generating_eval_command_loads_the_backend_given_by_backend(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--backend llamacpp`` reaches the model loader, and the generation cache is named after it."""
    from support.scripted_cli import scripted_loader
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app
    from logtoku_guard.backends.fake import ScriptedAnswer
    from logtoku_guard.cli import toolkit

    backends: list[str] = []
    answer: Any = ScriptedAnswer(["Shake", "speare", "."], [FIVE, FIVE, FIVE])
    if command == "guard":
        answer = nq_script([])
    elif command == "traffic":  # right and confident on every other real question, so the guard can be fit
        from logtoku_eval.traffic_eval import traffic_questions

        refs = {q.question: q.answers[0] for i, q in enumerate(traffic_questions()) if q.answers and i % 2 == 0}

        def answer(messages: Any) -> ScriptedAnswer:
            ref = refs.get(messages[-1].content)
            return ScriptedAnswer([f" {ref}." if ref else " Nobody knows."], [FIVE if ref else [1.2, 1.1, 1.0, 0.9, 0.8]])

    monkeypatch.setattr(toolkit, "load_backend", scripted_loader(answer, backends=backends))
    root = make_data_dir(tmp_path / "data")
    if command == "guard":  # a pool to build the knowledge base from
        rows = [{"question": it.question.rstrip("?"), "answer": list(it.correct)} for it in nq_items(20)]
        (root / "nq_open" / "NQ-open.dev.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    common = ["--model", "m", "--backend", "llamacpp", "--gen-cache-dir", str(tmp_path / "gen"), "--out-dir", str(tmp_path / "o")]
    extra = {
        "truthfulqa": ["--data-dir", str(root), "--samples-limit", "0", "--judge", "rouge", "--guard-folds", "0"],
        "nq-open": ["--data-dir", str(root), "--guard-folds", "0"],
        "guard": ["--data-dir", str(root), "--limit", "8", "--live", "8", "--live-budget", "0.5", "--guard-folds", "0"],
        "fabricated": ["--limit", "2"],
        "traffic": ["--batch-size", "64"],
    }[command]
    res = CliRunner().invoke(
        eval_app, [command, *common, *extra, "--n-boot", "10", *([] if command == "fabricated" else ["--no-plots"])]
    )
    assert backends and set(backends) == {"llamacpp"}, (backends, res.output)
    assert res.exit_code == 0, res.output
    caches = [p.name for p in (tmp_path / "gen").rglob("*.jsonl")]
    assert caches and all("m@llamacpp" in p or "m_llamacpp" in p for p in caches), caches


def test_an_unknown_backend_is_refused_before_any_data_or_model_loads(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app

    for command in ("truthfulqa", "nq-open", "guard", "fabricated", "traffic"):
        res = CliRunner().invoke(eval_app, [command, "--backend", "vllm", "--out-dir", str(tmp_path / "o")])
        assert res.exit_code == 2 and "--backend must be one of transformers, llamacpp, openai, got 'vllm'" in " ".join(
            res.output.split()
        )
        assert "Traceback" not in res.output


def test_backend_help_names_the_llamacpp_extra_with_its_brackets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The help is Rich markup: ``[llamacpp]`` must be escaped or it vanishes as a tag."""
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app
    from logtoku_guard.cli import app

    monkeypatch.setenv("COLUMNS", "300")
    for cli, args in ((app, ["ask", "--help"]), (eval_app, ["fabricated", "--help"])):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0 and "pip install 'logtoku-guard[llamacpp]'" in res.output, res.output


def test_eval_guard_on_a_single_question_writes_undefined_shares_as_null_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One NQ question, covered by the knowledge base: the uncovered questions' shares are
    undefined. The report says n/a and why; the JSON holds null (strict JSON, no NaN)."""
    from support.scripted_cli import scripted_loader
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app
    from logtoku_guard.cli import toolkit

    from .test_jsonout import strict_load

    monkeypatch.setattr(toolkit, "load_backend", scripted_loader(nq_script([])))
    root = make_data_dir(tmp_path / "data")
    row = {"question": nq_items(1)[0].question.rstrip("?"), "answer": list(nq_items(1)[0].correct)}
    (root / "nq_open" / "NQ-open.dev.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    out = tmp_path / "o"
    args = ["guard", "--model", "m", "--data-dir", str(root), "--gen-cache-dir", str(tmp_path / "gen"), "--out-dir", str(out)]
    res = CliRunner().invoke(eval_app, [*args, "--n-boot", "10", "--no-plots", "--live", "1"])
    assert res.exit_code == 0, res.output
    data = strict_load((out / "guard-e2e.json").read_text(encoding="utf-8"))
    d = data["diagnostics"]
    assert d["n"] == 1 and d["rag_accuracy_covered"] == 1.0
    assert d["rag_accuracy_uncovered"] is None and d["answer_in_context_uncovered"] is None
    why = "no uncovered question: the knowledge base (faq-c0.7-s0-n1) covers 1 of the 1 evaluated questions"
    assert d["undefined"] == {"rag_accuracy_uncovered": why, "answer_in_context_uncovered": why}
    md = (out / "guard-e2e.md").read_text(encoding="utf-8")
    assert "uncovered n/a" in md and f"n/a (rag_accuracy_uncovered, answer_in_context_uncovered): {why}." in md
    assert "nan" not in md.replace("Scored NaN", "").lower()


@pytest.mark.parametrize(
    ("flags", "judge_backend"),
    [([], "llamacpp"), (["--judge-backend", "transformers"], "transformers"), (["--judge-backend", "llamacpp"], "llamacpp")],
)
def test_the_llm_judge_loads_with_the_judge_backend_or_else_the_backend(
    flags: list[str], judge_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--judge-model`` is loaded by ``--judge-backend``, by default the ``--backend`` of the model under test."""
    from support.scripted_cli import scripted_loader
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app
    from logtoku_eval.judges import LLM_JUDGE_PROMPT
    from logtoku_guard.backends.fake import ScriptedAnswer
    from logtoku_guard.cli import toolkit

    asks = LLM_JUDGE_PROMPT.rsplit("\n", 1)[-1].split("?")[-1].strip()  # "Reply with yes or no only."

    def answer(messages: Any) -> ScriptedAnswer:
        if asks in messages[-1].content:
            return ScriptedAnswer([" yes"], [FIVE])
        return ScriptedAnswer(["Shake", "speare", "."], [FIVE, FIVE, FIVE])

    calls: list[tuple[str, int, str]] = []
    backends: list[str] = []
    monkeypatch.setattr(toolkit, "load_backend", scripted_loader(answer, calls=calls, backends=backends))
    root = make_data_dir(tmp_path / "data")
    args = ["truthfulqa", "--model", "m", "--backend", "llamacpp", "--data-dir", str(root), "--judge", "llm"]
    args += ["--judge-model", "big-judge", "--gen-cache-dir", str(tmp_path / "gen"), "--out-dir", str(tmp_path / "o")]
    args += ["--samples-limit", "0", "--guard-folds", "0", "--n-boot", "10", "--no-plots"]
    res = CliRunner().invoke(eval_app, [*args, *flags])
    assert res.exit_code == 0, res.output
    loads = {model: backend for (model, _, _), backend in zip(calls, backends)}
    assert loads == {"big-judge": judge_backend, "m": "llamacpp"}
    assert "llm-judge:big-judge" in res.output


def test_an_unknown_judge_backend_is_refused_before_any_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app
    from logtoku_guard.cli import toolkit

    monkeypatch.setattr(toolkit, "load_backend", lambda *a, **k: pytest.fail("no model may load"))
    res = CliRunner().invoke(eval_app, ["truthfulqa", "--judge", "llm", "--judge-model", "j", "--judge-backend", "vllm"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "--judge-backend must be one of transformers, llamacpp, openai, got 'vllm'" in text, text
    assert "Traceback" not in text


def test_generation_caches_of_the_embedded_model_on_llama_cpp_are_named_by_its_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42: the cache of F16 answers must not be read as Q4_1's (the first F16 run wrote under Q4_1's name)."""
    from logtoku_eval.cli.common import model_name

    monkeypatch.delenv("LOGTOKU_GUARD_LLAMACPP_WEIGHTS", raising=False)
    assert model_name("embedded", "llamacpp") == "smollm2-135m-instruct-f16@llamacpp"  # the default weights
    monkeypatch.setenv("LOGTOKU_GUARD_LLAMACPP_WEIGHTS", "q4_1")
    assert model_name("smollm2-135m-instruct", "llamacpp") == "smollm2-135m-instruct@llamacpp"  # the shipped file
    monkeypatch.setenv("LOGTOKU_GUARD_LLAMACPP_WEIGHTS", "q8_0")
    assert model_name("default", "llamacpp") == "smollm2-135m-instruct-q8_0@llamacpp"
    assert model_name("embedded") == "smollm2-135m-instruct"  # transformers: one name, float32 weights
    # a file and a packaged model are named as the backend names them (one function: the backend's own)
    assert model_name("/m/gemma.gguf", "llamacpp") == "gemma@llamacpp"
    assert model_name("gemma3-270m", "llamacpp") == "gemma-3-270m-q4_k_m@llamacpp"
