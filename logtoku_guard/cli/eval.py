"""``logtoku-guard eval ...``: the benchmark commands (typer), over :mod:`logtoku_guard.evaluation`.

Only typer, rich and the CLI's shared module are imported here; numpy, torch, transformers and matplotlib are
imported inside the commands, so registering this sub-app costs nothing at CLI start.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from logtoku_guard.cli import _common
from logtoku_guard.cli._common import DeviceOpt

eval_app = typer.Typer(
    help=(
        "Benchmarks: TruthfulQA and NQ-open response reliability, GoEmotions dynamic decoding, known vs "
        "fabricated questions (fabricated), realistic traffic: right and wrong answers to real questions and plausible "
        "fabrications (traffic), and the guard end to end with retrieval (guard). Generations are "
        "cached under --gen-cache-dir and results written to --out-dir (both default to the user cache folder)."
    ),
    no_args_is_help=True,
)

ModelOpt = Annotated[
    str, typer.Option(help="Model under test: the embedded default, a local folder, a .gguf file or a cached hub id.")
]
LimitOpt = Annotated[int | None, typer.Option(help="Evaluate only the first N questions (default: all).")]
GenCacheOpt = Annotated[
    Path | None,
    typer.Option(
        "--gen-cache-dir",
        help="Generation cache folder (JSONL per model, dataset, K stored, decoding); resumable. "
        "Default: eval/generations in the user cache ($LOGTOKU_GUARD_CACHE or the platform's cache folder).",
    ),
]
OutDirOpt = Annotated[
    Path | None,
    typer.Option(
        help="Where the markdown, JSON and PNG results are written. Default: eval/results in the user cache "
        "($LOGTOKU_GUARD_CACHE or the platform's cache folder); the paths are printed at the end."
    ),
]
DataDirOpt = Annotated[
    Path | None, typer.Option(help="Evaluation datasets folder (default: $LOGTOKU_GUARD_DATA; README: Evaluation datasets).")
]
ModelCacheOpt = Annotated[
    Path | None, typer.Option(help="Cache of the converted embedded model (default: $LOGTOKU_GUARD_CACHE or the user cache).")
]
BootOpt = Annotated[int, typer.Option(help="Bootstrap resamples for the confidence intervals.")]
BatchOpt = Annotated[int, typer.Option(help="Questions per greedy generation batch.")]
PlotsOpt = Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG plots (needs matplotlib).")]
GuardFoldsOpt = Annotated[
    int,
    typer.Option(
        help="Folds of the cross-fitted guard-score (each fold scored by the guard fit on the other folds' "
        "labelled answers of this run, never on its own; 0 = off)."
    ),
]
JudgeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--judge",
        help="Judge (repeatable; the first is the primary one for plots): rouge, embedding, llm. BLEURT is unavailable offline.",
    ),
]


def _dirs(gen_cache_dir: Path | None, out_dir: Path | None) -> tuple[Path, Path]:
    """``--gen-cache-dir`` and ``--out-dir``, each defaulting to a folder of the user cache (never the working folder)."""
    from logtoku_guard.embedded import cache_root

    base = cache_root() / "eval"
    return gen_cache_dir or base / "generations", out_dir or base / "results"


MAX_BOOT = 1_000_000
"""Most bootstrap resamples (the intervals settle long before)."""


def _check_counts(
    *,
    limit: int | None = None,
    batch_size: int = 1,
    n_boot: int = 1,
    seed: int = 0,
    samples_limit: int = 0,
    n_samples: int = 2,
    guard_folds: int = 0,
) -> None:
    """The count options shared by the benchmarks, checked before any data or model loads."""
    from logtoku_guard.errors import ConfigurationError

    checks = [
        ("--limit", limit, 1, None, "a number of questions"),
        ("--batch-size", batch_size, 1, None, "a number of questions per batch"),
        ("--n-boot", n_boot, 1, MAX_BOOT, "a number of bootstrap resamples"),
        ("--seed", seed, 0, _common.SEED_MAX, "a seed"),
        ("--samples-limit", samples_limit, 0, None, "a number of questions (0 = no sampling baselines)"),
        ("--n-samples", n_samples, 2, None, "a number of sampled answers per question"),
    ]
    for flag, value, lo, hi, what in checks:
        if value is None:
            continue
        if value < lo or (hi is not None and value > hi):
            bound = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
            msg = f"{flag} {value} is out of range; give {what}, {bound}"
            raise _common.fail(ConfigurationError(msg))
    if guard_folds < 0 or guard_folds == 1:
        msg = f"--guard-folds {guard_folds} is out of range; give 0 (no cross-fitted guard score) or at least 2"
        raise _common.fail(ConfigurationError(msg))


def _model_name(model: str) -> str:
    from logtoku_guard.embedded import EMBEDDED_ALIASES, EMBEDDED_MODEL

    return EMBEDDED_MODEL if model in EMBEDDED_ALIASES else model


def _backend_loader(model: str, k: int, device: str, cache_dir: Path | None) -> Callable[[], Any]:
    def load() -> Any:
        return _common.load_backend(model, k, device, "auto", cache_dir)

    return load


def _progress_factory(progress: Any) -> Callable[[str, int, int], Callable[[int], None]]:
    def make(stage: str, total: int, done: int) -> Callable[[int], None]:
        task = progress.add_task(stage, total=total, completed=done)
        return lambda n: progress.advance(task, n)

    return make


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=_common.err,
    )


def _judges(names: list[str], judge_model: str | None, device: str, model_cache: Path | None) -> tuple[list[Any], Any]:
    from logtoku_guard.evaluation.judges import EmbeddingJudge, LLMJudge, MatchJudge, RougeJudge, TransformerEmbedder

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
            judges.append(LLMJudge(_backend_loader(judge_model, 2, device, model_cache)()))
        elif name == "bleurt":
            msg = "BLEURT is not available offline (its checkpoints download at run time; TensorFlow); use rouge or embedding"
            raise typer.BadParameter(msg)
        else:
            msg = f"unknown judge {name!r}; use rouge, embedding or llm"
            raise typer.BadParameter(msg)
    return judges, embedder


def _run_qa(
    dataset: str,
    items: list[Any],
    default_judges: list[str],
    *,
    model: str,
    judge: list[str] | None,
    judge_model: str | None,
    samples_limit: int,
    n_samples: int,
    temperature: float,
    batch_size: int,
    cache_dir: Path,
    out_dir: Path,
    n_boot: int,
    seed: int,
    plots: bool,
    device: str,
    model_cache: Path | None,
    guard_folds: int,
) -> None:
    from logtoku_guard.evaluation.generate import K_STORED, SamplingSpec
    from logtoku_guard.evaluation.judges import MINILM_PACKAGE, TransformerEmbedder
    from logtoku_guard.evaluation.qa import QAConfig, run_qa

    names = judge or default_judges
    judges, embedder = _judges(names, judge_model, device, model_cache)
    if samples_limit and embedder is None:
        import importlib.util

        if importlib.util.find_spec(MINILM_PACKAGE) is not None:
            embedder = TransformerEmbedder()  # for the semantic-entropy stand-in
    config = QAConfig(
        dataset=dataset,
        cache_dir=cache_dir,
        out_dir=out_dir,
        samples_limit=samples_limit,
        sampling=SamplingSpec(n=n_samples, temperature=temperature, seed=seed),
        batch_size=batch_size,
        n_boot=n_boot,
        seed=seed,
        plots=plots,
        guard_folds=guard_folds,
    )
    with _progress() as progress:
        result = run_qa(
            items,
            _model_name(model),
            _backend_loader(model, K_STORED, device, model_cache),
            judges,
            config,
            embedder=embedder,
            on_progress=_progress_factory(progress),
        )
    for report in result.reports:
        typer.echo(report.to_markdown())
    _common.err.print("written: " + ", ".join(str(p) for p in result.files), highlight=False)


@eval_app.command()
def truthfulqa(
    model: ModelOpt = "smollm2-135m-instruct",
    limit: LimitOpt = None,
    path: Annotated[Path | None, typer.Option(help="TruthfulQA.csv (default: <data-dir>/truthfulqa/TruthfulQA.csv).")] = None,
    data_dir: DataDirOpt = None,
    judge: JudgeOpt = None,
    judge_model: Annotated[str | None, typer.Option(help="Local model for --judge llm.")] = None,
    samples_limit: Annotated[
        int, typer.Option(help="Sampling baselines on the first N evaluated questions (0 = none; full set: a large N).")
    ] = 50,
    n_samples: Annotated[int, typer.Option(help="Sampled answers per question.")] = 10,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of the sampling baselines.")] = 0.5,
    batch_size: BatchOpt = 8,
    gen_cache_dir: GenCacheOpt = None,
    out_dir: OutDirOpt = None,
    n_boot: BootOpt = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap, the sampled answers and the guard-score folds.")] = 0,
    plots: PlotsOpt = True,
    device: DeviceOpt = "auto",
    model_cache: ModelCacheOpt = None,
    guard_folds: GuardFoldsOpt = 5,
) -> None:
    """TruthfulQA response reliability: AUROC/AUPRC/PRR/AURC of every method.

    Per judge, the cross-fitted guard-score and its paired difference against the best single-pass baseline.
    """
    _check_counts(
        limit=limit,
        batch_size=batch_size,
        n_boot=n_boot,
        seed=seed,
        samples_limit=samples_limit,
        n_samples=n_samples,
        guard_folds=guard_folds,
    )
    cache_dir, out_dir = _dirs(gen_cache_dir, out_dir)
    from logtoku_guard.errors import LogTokUError
    from logtoku_guard.evaluation.datasets import load_truthfulqa

    try:
        items = load_truthfulqa(path, data_dir=data_dir, limit=limit)
        _run_qa(
            "truthfulqa",
            items,
            ["rouge", "embedding"],
            model=model,
            judge=judge,
            judge_model=judge_model,
            samples_limit=samples_limit,
            n_samples=n_samples,
            temperature=temperature,
            batch_size=batch_size,
            cache_dir=cache_dir,
            out_dir=out_dir,
            n_boot=n_boot,
            seed=seed,
            plots=plots,
            device=device,
            model_cache=model_cache,
            guard_folds=guard_folds,
        )
    except LogTokUError as exc:
        raise _common.fail(exc) from exc


@eval_app.command("nq-open")
def nq_open(
    model: ModelOpt = "smollm2-135m-instruct",
    limit: LimitOpt = None,
    path: Annotated[Path | None, typer.Option(help="NQ-open JSONL (default: <data-dir>/nq_open/NQ-open.dev.jsonl).")] = None,
    data_dir: DataDirOpt = None,
    samples_limit: Annotated[int, typer.Option(help="Sampling baselines on the first N questions (0 = none).")] = 0,
    n_samples: Annotated[int, typer.Option(help="Sampled answers per question.")] = 10,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.5,
    batch_size: BatchOpt = 8,
    gen_cache_dir: GenCacheOpt = None,
    out_dir: OutDirOpt = None,
    n_boot: BootOpt = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap, the sampled answers and the guard-score folds.")] = 0,
    plots: PlotsOpt = True,
    device: DeviceOpt = "auto",
    model_cache: ModelCacheOpt = None,
    guard_folds: GuardFoldsOpt = 5,
) -> None:
    """NQ-open response reliability with the normalised exact/contains match judge (nq-match)."""
    _check_counts(
        limit=limit,
        batch_size=batch_size,
        n_boot=n_boot,
        seed=seed,
        samples_limit=samples_limit,
        n_samples=n_samples,
        guard_folds=guard_folds,
    )
    cache_dir, out_dir = _dirs(gen_cache_dir, out_dir)
    from logtoku_guard.errors import LogTokUError
    from logtoku_guard.evaluation.datasets import load_nq_open

    try:
        items = load_nq_open(path, data_dir=data_dir, limit=limit)
        _run_qa(
            "nq-open",
            items,
            ["match"],
            model=model,
            judge=["match"],
            judge_model=None,
            samples_limit=samples_limit,
            n_samples=n_samples,
            temperature=temperature,
            batch_size=batch_size,
            cache_dir=cache_dir,
            out_dir=out_dir,
            n_boot=n_boot,
            seed=seed,
            plots=plots,
            device=device,
            model_cache=model_cache,
            guard_folds=guard_folds,
        )
    except LogTokUError as exc:
        raise _common.fail(exc) from exc


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
    _check_counts(limit=limit, batch_size=batch_size)
    cache_dir, out_dir = _dirs(gen_cache_dir, out_dir)
    import json

    import numpy as np

    from logtoku_guard.errors import LogTokUError
    from logtoku_guard.evaluation.datasets import load_emotion_names, load_goemotions
    from logtoku_guard.evaluation.dynamic import collect_label_logits, evaluate_rules, label_cache, rules_markdown, to_ekman

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
        name = _model_name(model)
        caches = {s: label_cache(cache_dir, name, s, names) for s in splits}
        backend = None
        logits = {}
        with _progress() as progress:
            make = _progress_factory(progress)
            for s, items in splits.items():
                missing = [it for it in items if it.id not in caches[s]]
                if missing and backend is None:
                    backend = _backend_loader(model, 2, device, model_cache)()
                if missing:
                    progress_fn = make(f"goemotions {s}", len(items), len(items) - len(missing))
                    collect_label_logits(backend, missing, names, caches[s], batch_size=batch_size, on_progress=progress_fn)
                logits[s] = np.array([r.logits for r in caches[s].records([it.id for it in items])])
        results = evaluate_rules(
            logits["dev"], [it.labels for it in splits["dev"]], logits["test"], [it.labels for it in splits["test"]]
        )
    except LogTokUError as exc:
        raise _common.fail(exc) from exc
    md = f"Labels: {taxonomy} ({len(names)}: {', '.join(names)}).\n\n" + rules_markdown(
        results, len(splits["dev"]), len(splits["test"]), name
    )
    stem = "goemotions" if taxonomy == "goemotions" else "goemotions-ekman"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.md").write_text(md + "\n", encoding="utf-8")
    (out_dir / f"{stem}.json").write_text(
        json.dumps(
            {"model": name, "n_dev": len(splits["dev"]), "n_test": len(splits["test"]), "rules": [r.to_json() for r in results]},
            indent=1,
        ),
        encoding="utf-8",
    )
    typer.echo(md)
    _common.err.print(f"written: {out_dir / (stem + '.md')}, {out_dir / (stem + '.json')}", highlight=False)


def _budgets(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        msg = f"--budgets must be comma-separated shares in [0, 1] such as 0,0.1,0.3,1, got {text!r}"
        raise typer.BadParameter(msg) from exc
    if not values or any(not 0.0 <= b <= 1.0 for b in values):
        msg = f"--budgets must be comma-separated shares in [0, 1] such as 0,0.1,0.3,1, got {text!r}"
        raise typer.BadParameter(msg)
    return values


@eval_app.command("guard")
def guard_end_to_end(
    model: ModelOpt = "smollm2-135m-instruct",
    limit: LimitOpt = None,
    path: Annotated[Path | None, typer.Option(help="NQ-open JSONL (default: <data-dir>/nq_open/NQ-open.dev.jsonl).")] = None,
    data_dir: DataDirOpt = None,
    coverage: Annotated[
        float, typer.Option(help="Share of the evaluated questions whose own Q/A entry is in the knowledge base.")
    ] = 0.7,
    passages: Annotated[int, typer.Option(help="Passages retrieved per question (the policy's retrieve.passages).")] = 4,
    budgets: Annotated[
        str, typer.Option(help="Retrieval budgets (shares of questions) for the table, comma-separated.")
    ] = "0,0.1,0.2,0.3,0.5,0.7,1",
    live: Annotated[int, typer.Option(help="Run the real Guard on the first N questions to check the replay (0 = no).")] = 100,
    live_budget: Annotated[float, typer.Option(help="Retrieval budget of the live check's LogTokU guard.")] = 0.3,
    batch_size: BatchOpt = 8,
    gen_cache_dir: GenCacheOpt = None,
    out_dir: OutDirOpt = None,
    n_boot: BootOpt = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap, the knowledge base's coverage, the guard-score folds.")] = 0,
    plots: PlotsOpt = True,
    device: DeviceOpt = "auto",
    model_cache: ModelCacheOpt = None,
    guard_folds: GuardFoldsOpt = 5,
) -> None:
    """The guard end to end on NQ-open with a FAQ knowledge base: accuracy vs retrievals spent.

    Never/always retrieve, and guards that retrieve when LogTokU, entropy or probability
    reliability or the cross-fitted guard-score (fit on the closed-book answers' labels) is
    low, at matched retrieval budgets (replayed from cached closed-book and retrieval
    answers), plus a live run of the real Guard (LogTokU rule) on the first questions.
    """
    from logtoku_guard.errors import LogTokUError
    from logtoku_guard.evaluation.datasets import load_nq_open
    from logtoku_guard.evaluation.generate import K_STORED
    from logtoku_guard.evaluation.rag import GuardEvalConfig, run_guard_eval
    from logtoku_guard.policy import RetrieveSettings

    chosen = _budgets(budgets)
    _check_counts(limit=limit, batch_size=batch_size, n_boot=n_boot, seed=seed, guard_folds=guard_folds)
    if live < 0:
        msg = f"--live must be 0 (no live check) or a positive number of questions, got {live!r}"
        raise typer.BadParameter(msg)
    cache_dir, out_dir = _dirs(gen_cache_dir, out_dir)
    if passages < 1:
        msg = f"--passages must be at least 1, got {passages!r}"
        raise typer.BadParameter(msg)
    try:
        config = GuardEvalConfig(
            cache_dir=cache_dir,
            out_dir=out_dir,
            coverage=coverage,
            kb_seed=seed,
            settings=RetrieveSettings(passages=passages),
            budgets=chosen,
            batch_size=batch_size,
            n_boot=n_boot,
            seed=seed,
            live=live,
            live_budget=live_budget,
            plots=plots,
            guard_folds=guard_folds,
        )
        pool = load_nq_open(path, data_dir=data_dir)
        items = pool[:limit] if limit is not None else pool
        with _progress() as progress:
            result = run_guard_eval(
                items,
                pool,
                _model_name(model),
                _backend_loader(model, K_STORED, device, model_cache),
                config,
                live_backend=_backend_loader(model, 2, device, model_cache),
                on_progress=_progress_factory(progress),
            )
    except LogTokUError as exc:
        raise _common.fail(exc) from exc
    typer.echo(result.report.to_markdown())
    _common.err.print("written: " + ", ".join(str(p) for p in result.files), highlight=False)


@eval_app.command("fabricated")
def fabricated(
    model: ModelOpt = "smollm2-135m-instruct",
    limit: Annotated[
        int | None, typer.Option(help="First N known and first N fabricated questions of each half, for a quick run.")
    ] = None,
    l2: Annotated[float, typer.Option(help="L2 penalty of the guard score's logistic regression.")] = 1.0,
    batch_size: BatchOpt = 8,
    gen_cache_dir: GenCacheOpt = None,
    out_dir: OutDirOpt = None,
    n_boot: BootOpt = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap and of the cross-validation folds.")] = 0,
    device: DeviceOpt = "auto",
    model_cache: ModelCacheOpt = None,
) -> None:
    """Known vs fabricated questions: the guard score fit on the tune half, AUROC and policy rates on the test half."""
    from logtoku_guard.errors import LogTokUError
    from logtoku_guard.evaluation.fabricated import dataset_name, load_fabricated
    from logtoku_guard.evaluation.fabricated_eval import evaluate_fabricated, write_fabricated
    from logtoku_guard.evaluation.generate import K_STORED, GreedySpec, greedy_cache, run_greedy

    _check_counts(limit=limit, batch_size=batch_size, n_boot=n_boot, seed=seed)
    cache_dir, out_dir = _dirs(gen_cache_dir, out_dir)
    try:
        name = _model_name(model)
        halves = {s: _first_of_each_kind(load_fabricated(s), limit) for s in ("tune", "test")}
        cache = greedy_cache(cache_dir, name, dataset_name(), GreedySpec())
        todo = [it.to_qa_item() for s in halves for it in halves[s] if it.id not in cache]
        if todo:
            with _progress() as progress:
                total = sum(len(h) for h in halves.values())
                on = _progress_factory(progress)("fabricated", total, total - len(todo))
                backend = _backend_loader(model, K_STORED, device, model_cache)()
                run_greedy(backend, todo, cache, spec=GreedySpec(), batch_size=batch_size, on_progress=on)
        pairs = {s: [(cache.get(it.id), it.is_known) for it in halves[s]] for s in halves}
        report = evaluate_fabricated(pairs["tune"], pairs["test"], model=name, l2=l2, n_boot=n_boot, seed=seed)  # type: ignore[arg-type]
        files = write_fabricated(report, out_dir)
    except LogTokUError as exc:
        raise _common.fail(exc) from exc
    typer.echo(report.to_markdown())
    _common.err.print("written: " + ", ".join(str(p) for p in files), highlight=False)


@eval_app.command("traffic")
def traffic(
    model: ModelOpt = "smollm2-135m-instruct",
    pass_target: Annotated[
        float, typer.Option(help="Share of correct real answers the chosen flag threshold must pass (on the tune half).")
    ] = 0.85,
    l2: Annotated[float, typer.Option(help="L2 penalty of the guard score's logistic regression.")] = 1.0,
    balance_groups: Annotated[
        bool, typer.Option(help="Weight the four groups equally in the guard's fit (default: every answer counts once).")
    ] = False,
    batch_size: BatchOpt = 16,
    gen_cache_dir: GenCacheOpt = None,
    out_dir: OutDirOpt = None,
    n_boot: BootOpt = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap and of the cross-validation folds.")] = 0,
    plots: PlotsOpt = True,
    device: DeviceOpt = "auto",
    model_cache: ModelCacheOpt = None,
) -> None:
    """Realistic traffic: correct and wrong answers to real questions, plausible and syllable-name fabrications.

    Answers as `ask` makes them; the guard is fit on the tune half (pooled over the groups), its flag
    threshold chosen there; flag rates per group with 95% CIs on the test half. Writes traffic.md,
    traffic.json and the fitted guard traffic-guard.json.
    """
    from logtoku_guard.calibration.prompts import shipped_calibration_questions
    from logtoku_guard.errors import ConfigurationError, LogTokUError
    from logtoku_guard.evaluation.datasets import QAItem
    from logtoku_guard.evaluation.generate import K_STORED, SERVING, SERVING_TEMPLATE, greedy_cache, run_greedy
    from logtoku_guard.evaluation.traffic import dataset_name
    from logtoku_guard.evaluation.traffic_eval import evaluate_traffic, judge_answers, traffic_questions, write_traffic

    _check_counts(batch_size=batch_size, n_boot=n_boot, seed=seed)
    if not 0.0 < pass_target < 1.0:
        raise _common.fail(ConfigurationError(f"--pass-target {pass_target!r} must be between 0 and 1, e.g. 0.85"))
    cache_dir, out_dir = _dirs(gen_cache_dir, out_dir)
    try:
        name = _model_name(model)
        questions = traffic_questions()
        calibration = [QAItem(q.id, q.question, q.answers) for q in shipped_calibration_questions()]
        caches = {
            "traffic": greedy_cache(cache_dir, name, dataset_name(), SERVING, template=SERVING_TEMPLATE),
            "syllable": greedy_cache(cache_dir, name, "traffic-syllable", SERVING, template=SERVING_TEMPLATE),
            "calibration": greedy_cache(cache_dir, name, "calibration-default", SERVING, template=SERVING_TEMPLATE),
        }
        work = {
            "traffic": [QAItem(q.id, q.question, q.answers) for q in questions if q.group != "syllable"],
            "syllable": [QAItem(q.id, q.question, q.answers) for q in questions if q.group == "syllable"],
            "calibration": calibration,
        }
        todo = {k: [it for it in items if it.id not in caches[k]] for k, items in work.items()}
        if any(todo.values()):
            backend = _backend_loader(model, K_STORED, device, model_cache)()
            with _progress() as progress:
                for key, items in work.items():
                    on = _progress_factory(progress)(key, len(items), len(items) - len(todo[key]))
                    run_greedy(backend, todo[key], caches[key], spec=SERVING, batch_size=batch_size, on_progress=on)
        pairs = [(q, caches["syllable" if q.group == "syllable" else "traffic"].get(q.id)) for q in questions]
        answers = judge_answers(pairs)  # type: ignore[arg-type]
        cal = caches["calibration"].records([it.id for it in calibration])
        report = evaluate_traffic(
            answers, cal, model=name, pass_target=pass_target, l2=l2, balance_groups=balance_groups, n_boot=n_boot, seed=seed
        )
        files = write_traffic(report, out_dir, plots=plots)
    except LogTokUError as exc:
        raise _common.fail(exc) from exc
    typer.echo(report.to_markdown())
    _common.err.print("written: " + ", ".join(str(p) for p in files), highlight=False)


def _first_of_each_kind(items: list[Any], limit: int | None) -> list[Any]:
    if limit is None:
        return items
    return [it for kind in ("known", "fabricated") for it in [x for x in items if x.kind == kind][:limit]]
