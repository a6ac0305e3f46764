"""The ``eval`` sub-app, and the options and helpers every benchmark command shares.

:func:`run_options` declares the options of every generating benchmark (``--batch-size`` to
``--backend``) on a command, which gets them as one :class:`RunOptions`. Only typer, rich and the
core CLI's public toolkit (:mod:`logtoku_guard.cli.toolkit`) are imported here; the harness is
imported inside the commands, so registering the sub-app costs nothing at CLI start.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from logtoku_guard.cli import toolkit
from logtoku_guard.cli.toolkit import BackendOpt, DeviceOpt

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


def output_dirs(gen_cache_dir: Path | None, out_dir: Path | None) -> tuple[Path, Path]:
    """``--gen-cache-dir`` and ``--out-dir``, each defaulting to a folder of the user cache (never the working folder)."""
    from logtoku_guard.backends.embedded import cache_root

    base = cache_root() / "eval"
    return gen_cache_dir or base / "generations", out_dir or base / "results"


MAX_BOOT = 1_000_000
"""Most bootstrap resamples (the intervals settle long before)."""


def check_counts(
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
        ("--seed", seed, 0, toolkit.SEED_MAX, "a seed"),
        ("--samples-limit", samples_limit, 0, None, "a number of questions (0 = no sampling baselines)"),
        ("--n-samples", n_samples, 2, None, "a number of sampled answers per question"),
    ]
    for flag, value, lo, hi, what in checks:
        if value is None:
            continue
        if value < lo or (hi is not None and value > hi):
            bound = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
            msg = f"{flag} {value} is out of range; give {what}, {bound}"
            raise toolkit.fail(ConfigurationError(msg))
    if guard_folds < 0 or guard_folds == 1:
        msg = f"--guard-folds {guard_folds} is out of range; give 0 (no cross-fitted guard score) or at least 2"
        raise toolkit.fail(ConfigurationError(msg))


def check_backend_option(backend: str, device: str) -> None:
    """``--backend`` (and ``--device`` with it), checked before any data or model loads."""
    from logtoku_guard.errors import ConfigurationError

    try:
        toolkit.check_backend(backend, device)
    except ConfigurationError as exc:
        raise toolkit.fail(exc) from exc


def model_name(model: str, backend: str = "transformers") -> str:
    """The name the backend records on its generations (what names the generation caches), found without
    loading it: the llama.cpp backend's own :func:`~logtoku_guard.backends.llamacpp.llamacpp_model_name`
    (the embedded model's weights, ``$LOGTOKU_GUARD_LLAMACPP_WEIGHTS``; a packaged model by its file)."""
    from logtoku_guard.backends.embedded import EMBEDDED_ALIASES, EMBEDDED_MODEL

    if backend == "llamacpp":
        from logtoku_guard.backends.llamacpp import llamacpp_model_name

        return llamacpp_model_name(model)
    return EMBEDDED_MODEL if model in EMBEDDED_ALIASES else model


def backend_loader(model: str, k: int, device: str, cache_dir: Path | None, backend: str = "transformers") -> Callable[[], Any]:
    def load() -> Any:
        return toolkit.load_backend(model, k, device, "auto", cache_dir, backend=backend)

    return load


def progress_factory(progress: Any) -> Callable[[str, int, int], Callable[[int], None]]:
    def make(stage: str, total: int, done: int) -> Callable[[int], None]:
        task = progress.add_task(stage, total=total, completed=done)
        return lambda n: progress.advance(task, n)

    return make


def progress_bar() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=toolkit.err,
    )


@dataclass(frozen=True)
class RunOptions:
    """The options every generating benchmark shares, as one value (:func:`run_options` declares them)."""

    batch_size: int
    gen_cache_dir: Path | None
    out_dir: Path | None
    n_boot: int
    seed: int
    device: str
    model_cache: Path | None
    backend: str
    plots: bool = False
    guard_folds: int = 0

    def check(self, *, limit: int | None = None, samples_limit: int = 0, n_samples: int = 2) -> None:
        """These counts (with the command's own) and ``--backend``, checked before any data or model loads."""
        check_counts(
            limit=limit,
            batch_size=self.batch_size,
            n_boot=self.n_boot,
            seed=self.seed,
            samples_limit=samples_limit,
            n_samples=n_samples,
            guard_folds=self.guard_folds,
        )
        check_backend_option(self.backend, self.device)

    def dirs(self) -> tuple[Path, Path]:
        """The generation cache and results folders (:func:`output_dirs`)."""
        return output_dirs(self.gen_cache_dir, self.out_dir)

    def model_name(self, model: str) -> str:
        """The name the backend records on its generations (:func:`model_name`)."""
        return model_name(model, self.backend)

    def loader(self, model: str, k: int) -> Callable[[], Any]:
        """Loads ``model`` on ``--device`` with ``--backend``, keeping ``k`` logits a step."""
        return backend_loader(model, k, self.device, self.model_cache, self.backend)

    def answer_missing(self, model: str, work: Mapping[str, Sequence[Any]], caches: Mapping[str, Any], spec: Any) -> None:
        """Answers decoded as ``spec`` says (greedy, or sampled: :func:`~logtoku_eval.generate.run_answers`) into
        ``caches[key]`` for the questions of ``work[key]`` it lacks, a progress bar per key; the model loads
        only when one is missing."""
        from logtoku_eval.generate import K_STORED, run_answers

        todo = {key: [it for it in items if it.id not in caches[key]] for key, items in work.items()}
        if not any(todo.values()):
            return
        loaded = self.loader(model, K_STORED)()
        with progress_bar() as progress:
            for key, items in work.items():
                on = progress_factory(progress)(key, len(items), len(items) - len(todo[key]))
                run_answers(loaded, todo[key], caches[key], spec=spec, batch_size=self.batch_size, on_progress=on)


def run_options(
    *, batch_size: int, seed_help: str, plots: bool = False, guard_folds: bool = False
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Declares the shared options in place of a command's keyword-only ``run`` parameter (a :class:`RunOptions`).

    In this order: ``--batch-size`` (default ``batch_size``), ``--gen-cache-dir``, ``--out-dir``,
    ``--n-boot``, ``--seed`` (``seed_help`` says what it seeds), ``--plots/--no-plots`` (with
    ``plots``), ``--device``, ``--model-cache``, ``--guard-folds`` (with ``guard_folds``), ``--backend``.
    """
    shared: list[tuple[str, Any, Any]] = [
        ("batch_size", BatchOpt, batch_size),
        ("gen_cache_dir", GenCacheOpt, None),
        ("out_dir", OutDirOpt, None),
        ("n_boot", BootOpt, 1000),
        ("seed", Annotated[int, typer.Option(help=seed_help)], 0),
        *([("plots", PlotsOpt, True)] if plots else []),
        ("device", DeviceOpt, "auto"),
        ("model_cache", ModelCacheOpt, None),
        *([("guard_folds", GuardFoldsOpt, 5)] if guard_folds else []),
        ("backend", BackendOpt, "transformers"),
    ]
    names = [name for name, _, _ in shared]
    keyword = inspect.Parameter.KEYWORD_ONLY

    def declare(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)  # typer reads the annotations as objects
        own = list(signature.parameters.values())
        at = [p.name for p in own].index("run")
        params = [
            *(p.replace(kind=keyword) for p in own[:at]),
            *(inspect.Parameter(name, keyword, annotation=hint, default=default) for name, hint, default in shared),
            *(p.replace(kind=keyword) for p in own[at + 1 :]),
        ]

        @functools.wraps(command)
        def with_run(**options: Any) -> None:
            run = RunOptions(**{name: options.pop(name) for name in names})
            command(run=run, **options)

        with_run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        with_run.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return with_run

    return declare


def written(files: Sequence[Path]) -> None:
    """The files a command wrote, on stderr (its report went to stdout)."""
    toolkit.err.print("written: " + ", ".join(str(p) for p in files), highlight=False)
