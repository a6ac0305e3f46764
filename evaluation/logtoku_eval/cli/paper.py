"""``logtoku-guard eval truthfulqa | nq-open | dynamic-decoding``: the paper's protocols (the sub-app,
its shared options and helpers are in :mod:`logtoku_eval.cli.common`).

Only typer, rich and the core CLI's public toolkit (:mod:`logtoku_guard.cli.toolkit`) are imported
here; numpy, torch, transformers and matplotlib are imported inside the commands, so registering
this sub-app costs nothing at CLI start.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from logtoku_eval.cli.common import (
    DataDirOpt,
    GenCacheOpt,
    LimitOpt,
    ModelCacheOpt,
    ModelOpt,
    OutDirOpt,
    RunOptions,
    backend_loader,
    check_counts,
    eval_app,
    model_name,
    output_dirs,
    progress_bar,
    progress_factory,
    run_options,
    written,
)
from logtoku_guard.cli import toolkit
from logtoku_guard.cli.toolkit import DeviceOpt

if TYPE_CHECKING:
    from logtoku_guard.backends.transformers import TransformersBackend

JudgeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--judge",
        help="Judge (repeatable; the first is the primary one for plots): rouge, embedding, llm. BLEURT is unavailable offline.",
    ),
]
JudgeModelOpt = Annotated[
    str | None,
    typer.Option(help="Local model for --judge llm (a folder, a .gguf file or a cached hub id), run by --judge-backend."),
]
JudgeBackendOpt = Annotated[
    str | None,
    typer.Option(
        "--judge-backend",
        help="Backend of --judge-model: transformers or llamacpp (default: --backend). --device applies to a "
        "transformers judge; a llama.cpp judge runs on the CPU.",
    ),
]


def check_judge_backend(judge_backend: str) -> None:
    """``--judge-backend``, checked before any data or model loads."""
    from logtoku_guard.errors import ConfigurationError

    if judge_backend not in toolkit.BACKENDS:
        msg = f"--judge-backend must be one of {', '.join(toolkit.BACKENDS)}, got {judge_backend!r}"
        raise toolkit.fail(ConfigurationError(msg))


def _judges(
    names: list[str], judge_model: str | None, device: str, model_cache: Path | None, judge_backend: str = "transformers"
) -> tuple[list[Any], Any]:
    from logtoku_eval.judges import EmbeddingJudge, LLMJudge, MatchJudge, RougeJudge, TransformerEmbedder

    judges: list[Any] = []
    embedder = None
    for name in names:
        if name == "rouge":
            judges.append(RougeJudge())
        elif name == "match":
            judges.append(MatchJudge())
        elif name == "embedding":
            embedder = embedder or TransformerEmbedder()
            judges.append(EmbeddingJudge(embedder))
        elif name == "llm":
            if not judge_model:
                msg = "--judge llm needs --judge-model (a local model bigger than the one under test)"
                raise typer.BadParameter(msg)
            judge_device = device if judge_backend == "transformers" else "auto"  # llama.cpp: the CPU
            judges.append(LLMJudge(backend_loader(judge_model, 2, judge_device, model_cache, judge_backend)()))
        elif name == "bleurt":
            msg = "BLEURT is not available offline (its checkpoints download at run time; TensorFlow); use rouge or embedding"
            raise typer.BadParameter(msg)
        else:
            msg = f"unknown judge {name!r}; use rouge, embedding or llm"
            raise typer.BadParameter(msg)
    return judges, embedder


def _run_qa(
    dataset: str,
    load: Callable[[], list[Any]],
    names: list[str],
    run: RunOptions,
    *,
    model: str,
    samples: tuple[int, int, float],
    judge_model: str | None = None,
    judge_backend: str | None = None,
) -> None:
    """``dataset``'s questions (``load``), answered, judged by ``names`` and reported; ``samples``: the
    sampling baselines' questions, answers per question and temperature; a library error ends the command."""
    from logtoku_guard.errors import LogTokUError

    try:
        _answer_qa(dataset, load(), names, run, model, samples, judge_model, judge_backend or run.backend)
    except LogTokUError as exc:
        raise toolkit.fail(exc) from exc


def _answer_qa(
    dataset: str,
    items: list[Any],
    names: list[str],
    run: RunOptions,
    model: str,
    samples: tuple[int, int, float],
    judge_model: str | None,
    judge_backend: str,
) -> None:
    from logtoku_eval.generate import K_STORED, SamplingSpec
    from logtoku_eval.judges import MINILM_PACKAGE, TransformerEmbedder
    from logtoku_eval.qa import QAConfig, run_qa

    samples_limit, n_samples, temperature = samples
    judges, embedder = _judges(names, judge_model, run.device, run.model_cache, judge_backend)
    if samples_limit and embedder is None:
        import importlib.util

        if importlib.util.find_spec(MINILM_PACKAGE) is not None:
            embedder = TransformerEmbedder()  # for the semantic-entropy stand-in
    cache_dir, out_dir = run.dirs()
    config = QAConfig(
        dataset=dataset,
        cache_dir=cache_dir,
        out_dir=out_dir,
        samples_limit=samples_limit,
        sampling=SamplingSpec(n=n_samples, temperature=temperature, seed=run.seed),
        batch_size=run.batch_size,
        n_boot=run.n_boot,
        seed=run.seed,
        plots=run.plots,
        guard_folds=run.guard_folds,
    )
    with progress_bar() as progress:
        result = run_qa(
            items,
            run.model_name(model),
            run.loader(model, K_STORED),
            judges,
            config,
            embedder=embedder,
            on_progress=progress_factory(progress),
        )
    for report in result.reports:
        typer.echo(report.to_markdown())
    written(result.files)


_QA_SEED = "Seed of the bootstrap, the sampled answers and the guard-score folds."


@eval_app.command()
@run_options(batch_size=8, seed_help=_QA_SEED, plots=True, guard_folds=True)
def truthfulqa(
    model: ModelOpt = "smollm2-135m-instruct",
    limit: LimitOpt = None,
    path: Annotated[Path | None, typer.Option(help="TruthfulQA.csv (default: <data-dir>/truthfulqa/TruthfulQA.csv).")] = None,
    data_dir: DataDirOpt = None,
    judge: JudgeOpt = None,
    judge_model: JudgeModelOpt = None,
    samples_limit: Annotated[
        int, typer.Option(help="Sampling baselines on the first N evaluated questions (0 = none; full set: a large N).")
    ] = 50,
    n_samples: Annotated[int, typer.Option(help="Sampled answers per question.")] = 10,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of the sampling baselines.")] = 0.5,
    *,
    run: RunOptions,
    judge_backend: JudgeBackendOpt = None,
) -> None:
    """TruthfulQA response reliability: AUROC/AUPRC/PRR/AURC of every method.

    Per judge, the cross-fitted guard-score and its paired difference against the best single-pass baseline.
    """
    run.check(limit=limit, samples_limit=samples_limit, n_samples=n_samples)
    check_judge_backend(judge_backend or run.backend)
    from logtoku_eval.datasets import load_truthfulqa

    load = lambda: load_truthfulqa(path, data_dir=data_dir, limit=limit)  # noqa: E731
    samples = (samples_limit, n_samples, temperature)
    names = judge or ["rouge", "embedding"]
    _run_qa("truthfulqa", load, names, run, model=model, samples=samples, judge_model=judge_model, judge_backend=judge_backend)


@eval_app.command("nq-open")
@run_options(batch_size=8, seed_help=_QA_SEED, plots=True, guard_folds=True)
def nq_open(
    model: ModelOpt = "smollm2-135m-instruct",
    limit: LimitOpt = None,
    path: Annotated[Path | None, typer.Option(help="NQ-open JSONL (default: <data-dir>/nq_open/NQ-open.dev.jsonl).")] = None,
    data_dir: DataDirOpt = None,
    samples_limit: Annotated[int, typer.Option(help="Sampling baselines on the first N questions (0 = none).")] = 0,
    n_samples: Annotated[int, typer.Option(help="Sampled answers per question.")] = 10,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.5,
    *,
    run: RunOptions,
) -> None:
    """NQ-open response reliability with the normalised exact/contains match judge (nq-match)."""
    run.check(limit=limit, samples_limit=samples_limit, n_samples=n_samples)
    from logtoku_eval.datasets import load_nq_open

    load = lambda: load_nq_open(path, data_dir=data_dir, limit=limit)  # noqa: E731
    _run_qa("nq-open", load, ["match"], run, model=model, samples=(samples_limit, n_samples, temperature))


@eval_app.command("dynamic-decoding")
def dynamic_decoding(
    model: ModelOpt = "smollm2-135m-instruct",
    limit: Annotated[int | None, typer.Option(help="First N comments of each split (dev and test).")] = None,
    data_dir: DataDirOpt = None,
    taxonomy: Annotated[
        str, typer.Option(help="Labels: 'goemotions' (the 28 labels) or 'ekman' (their 7-way Ekman grouping).")
    ] = "goemotions",
    batch_size: Annotated[int, typer.Option(help="Comments per forward pass.")] = 16,
    gen_cache_dir: GenCacheOpt = None,
    out_dir: OutDirOpt = None,
    device: DeviceOpt = "auto",
    model_cache: ModelCacheOpt = None,
) -> None:
    """GoEmotions: add a second label when u = EU/AU is low; tuned on dev, reported on test."""
    check_counts(limit=limit, batch_size=batch_size)
    cache_dir, out_dir = output_dirs(gen_cache_dir, out_dir)
    import numpy as np

    from logtoku_eval.datasets import load_emotion_names, load_goemotions
    from logtoku_eval.dynamic import collect_label_logits, evaluate_rules, label_cache, rules_markdown, to_ekman
    from logtoku_eval.jsonout import write_json
    from logtoku_guard.errors import LogTokUError

    if taxonomy not in ("goemotions", "ekman"):
        msg = f"--taxonomy must be 'goemotions' or 'ekman', got {taxonomy!r}"
        raise typer.BadParameter(msg)
    try:
        names = load_emotion_names(data_dir)
        splits = {s: load_goemotions(s, data_dir=data_dir, limit=limit) for s in ("dev", "test")}
        if taxonomy == "ekman":
            fine = names
            for s in splits:
                names, splits[s] = to_ekman(splits[s], fine)
        name = model_name(model)
        caches = {s: label_cache(cache_dir, name, s, names) for s in splits}
        backend: TransformersBackend | None = None  # loaded only when a cache misses
        logits = {}
        with progress_bar() as progress:
            make = progress_factory(progress)
            for s, items in splits.items():
                missing = [it for it in items if it.id not in caches[s]]
                if missing:
                    backend = backend or backend_loader(model, 2, device, model_cache)()
                    progress_fn = make(f"goemotions {s}", len(items), len(items) - len(missing))
                    collect_label_logits(backend, missing, names, caches[s], batch_size=batch_size, on_progress=progress_fn)
                logits[s] = np.array([r.logits for r in caches[s].records([it.id for it in items])])
        results = evaluate_rules(
            logits["dev"], [it.labels for it in splits["dev"]], logits["test"], [it.labels for it in splits["test"]]
        )
    except LogTokUError as exc:
        raise toolkit.fail(exc) from exc
    md = f"Labels: {taxonomy} ({len(names)}: {', '.join(names)}).\n\n" + rules_markdown(
        results, len(splits["dev"]), len(splits["test"]), name
    )
    stem = "goemotions" if taxonomy == "goemotions" else "goemotions-ekman"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.md").write_text(md + "\n", encoding="utf-8")
    rules = [r.to_json() for r in results]
    write_json(
        out_dir / f"{stem}.json", {"model": name, "n_dev": len(splits["dev"]), "n_test": len(splits["test"]), "rules": rules}
    )
    typer.echo(md)
    toolkit.err.print(f"written: {out_dir / (stem + '.md')}, {out_dir / (stem + '.json')}", highlight=False)
