"""``logtoku-guard eval`` (``evaluation.cli``) from filled caches; registering it imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from logtoku_guard.backends.fake import ScriptedBackend
from logtoku_eval.cache import CachedLabelLogits
from logtoku_eval.datasets import load_emotion_names, load_goemotions, load_nq_open, load_truthfulqa
from logtoku_eval.dynamic import label_cache
from logtoku_eval.generate import greedy_cache, run_greedy
from logtoku_eval.methods import HEADLINE
from logtoku_eval.rag import GuardEvalConfig, run_guard_eval

from .support import make_data_dir, nq_items, nq_script, qa_backend


def test_cli_registration_imports_no_heavy_dependency() -> None:
    code = "import sys, logtoku_guard.cli; print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_cli_truthfulqa_rescoring_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    root = make_data_dir(tmp_path / "data")
    items = load_truthfulqa(data_dir=root)
    run_greedy(qa_backend([]), items, greedy_cache(tmp_path / "cache", "scripted-model", "truthfulqa"))
    args = [
        "eval",
        "truthfulqa",
        "--model",
        "scripted-model",
        "--data-dir",
        str(root),
        "--gen-cache-dir",
        str(tmp_path / "cache"),
    ]
    args += ["--out-dir", str(tmp_path / "out"), "--samples-limit", "0", "--judge", "rouge", "--n-boot", "20", "--no-plots"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "rouge-l-rule" in res.output and HEADLINE in res.output
    assert (tmp_path / "out" / "truthfulqa.json").exists()
    # 4 answers, 2 right: every fold's training part has fewer than 2 of a class -> NaN with the reason
    assert "| guard-score | logtoku |" in res.output and "Scored NaN: fold 0" in res.output
    off = CliRunner().invoke(app, [*args, "--guard-folds", "0"])
    assert off.exit_code == 0, off.output
    assert "| guard-score |" not in off.output and "cross-fitted" not in off.output
    one = CliRunner().invoke(app, [*args, "--guard-folds", "1"])
    assert one.exit_code == 2 and "--guard-folds 1" in one.output and "at least 2" in one.output
    bad = CliRunner().invoke(app, ["eval", "truthfulqa", "--data-dir", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2


def test_cli_help_documents_guard_folds() -> None:
    from typer.main import get_command
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    commands = get_command(app).commands["eval"].commands  # type: ignore[attr-defined]
    for command in ("truthfulqa", "nq-open", "guard"):
        res = CliRunner().invoke(app, ["eval", command, "--help"])
        assert res.exit_code == 0 and "--guard-folds" in res.output, res.output
        option = next(p for p in commands[command].params if p.name == "guard_folds")
        assert option.default == 5 and "0 = off" in option.help and "never on its own" in option.help


def test_cli_dynamic_decoding_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    root = make_data_dir(tmp_path / "data")
    names = load_emotion_names(root)
    rng = np.random.default_rng(0)
    for split in ("dev", "test"):
        cache = label_cache(tmp_path / "cache", "m", split, names)
        cache.append(CachedLabelLogits(it.id, tuple(rng.normal(3, 1, 4))) for it in load_goemotions(split, data_dir=root))
    args = ["eval", "dynamic-decoding", "--model", "m", "--data-dir", str(root), "--gen-cache-dir", str(tmp_path / "cache")]
    res = CliRunner().invoke(app, [*args, "--out-dir", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "u = EU/AU < t" in res.output
    data = json.loads((tmp_path / "out" / "goemotions.json").read_text())
    assert [r["rule"] for r in data["rules"]] == ["greedy", "top-2", "logtoku", "probability", "entropy"]


def test_cli_eval_writes_under_the_user_cache_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --gen-cache-dir/--out-dir nothing is written to the working folder."""
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

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
    res = CliRunner().invoke(app, ["eval", "dynamic-decoding", "--model", "m", "--data-dir", str(root)])
    assert res.exit_code == 0, res.output
    assert (cache_root / "eval" / "results" / "goemotions.json").exists()
    assert list(work.iterdir()) == []


def test_cli_eval_help_and_the_renamed_generation_cache_option() -> None:
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    res = CliRunner().invoke(app, ["eval", "--help"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "fabricated" in text and "guard" in text and "spec" not in text.lower()
    for command in ("truthfulqa", "nq-open", "dynamic-decoding", "guard", "fabricated"):
        sub = " ".join(CliRunner().invoke(app, ["eval", command, "--help"]).output.split())
        assert "--gen-cache-dir" in sub and "spec section" not in sub, sub
    old = CliRunner().invoke(app, ["eval", "fabricated", "--cache-dir", "x"])
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

    from logtoku_guard.cli import app

    res = CliRunner().invoke(app, ["eval", *args, "--out-dir", str(tmp_path / "o")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and piece in text and "Traceback" not in text, text
    assert not (tmp_path / "o").exists()


def test_cli_guard_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    data = tmp_path / "data" / "nq_open"
    data.mkdir(parents=True)
    rows = [{"question": it.question.rstrip("?"), "answer": list(it.correct)} for it in nq_items(20)]
    (data / "NQ-open.dev.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")

    pool = load_nq_open(data_dir=tmp_path / "data")
    run_guard_eval(
        pool[:6], pool, "scripted-model", ScriptedBackend(nq_script([]), k=5), GuardEvalConfig(cache_dir=tmp_path / "c", live=0)
    )
    args = ["eval", "guard", "--model", "scripted-model", "--data-dir", str(tmp_path / "data"), "--limit", "6"]
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
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "always retrieve" in res.output and (tmp_path / "out" / "guard-e2e.json").exists()
    assert "| guard-score | 0.3 |" in res.output and "| 0.3 | guard-score | random |" in res.output
    off = CliRunner().invoke(app, [*args, "--guard-folds", "0"])
    assert off.exit_code == 0 and "guard-score" not in off.output
    bad = CliRunner().invoke(app, [*args, "--budgets", "0,1.5"])
    assert bad.exit_code == 2 and "1.5" in bad.output
    bad = CliRunner().invoke(app, [*args, "--passages", "0"])
    assert bad.exit_code == 2 and "--passages" in bad.output
