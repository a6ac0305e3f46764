"""``logtoku-guard eval guard | fabricated | traffic``: the guard's own benchmarks (the paper's
protocols are in :mod:`logtoku_eval.cli.paper`; the sub-app, options and helpers in :mod:`logtoku_eval.cli.common`).

As there, only typer, rich and the core CLI's public toolkit are imported here; the evaluation
harness is imported inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from logtoku_eval.cli import common as ev
from logtoku_eval.cli.common import DataDirOpt, LimitOpt, ModelOpt, RunOptions, eval_app, run_options
from logtoku_guard.cli import toolkit


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
@run_options(
    batch_size=8,
    seed_help="Seed of the bootstrap, the knowledge base's coverage, the guard-score folds.",
    plots=True,
    guard_folds=True,
)
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
    *,
    run: RunOptions,
) -> None:
    """The guard end to end on NQ-open with a FAQ knowledge base: accuracy vs retrievals spent.

    Never/always retrieve, and guards that retrieve when LogTokU, entropy or probability
    reliability or the cross-fitted guard-score (fit on the closed-book answers' labels) is
    low, at matched retrieval budgets (replayed from cached closed-book and retrieval
    answers), plus a live run of the real Guard (LogTokU rule) on the first questions.
    """
    from logtoku_eval.datasets import load_nq_open
    from logtoku_eval.generate import K_STORED
    from logtoku_eval.rag import GuardEvalConfig, run_guard_eval
    from logtoku_guard.decision.policy import RetrieveSettings
    from logtoku_guard.errors import LogTokUError

    chosen = _budgets(budgets)
    run.check(limit=limit)
    if live < 0:
        msg = f"--live must be 0 (no live check) or a positive number of questions, got {live!r}"
        raise typer.BadParameter(msg)
    cache_dir, out_dir = run.dirs()
    if passages < 1:
        msg = f"--passages must be at least 1, got {passages!r}"
        raise typer.BadParameter(msg)
    try:
        config = GuardEvalConfig(
            cache_dir=cache_dir,
            out_dir=out_dir,
            coverage=coverage,
            kb_seed=run.seed,
            settings=RetrieveSettings(passages=passages),
            budgets=chosen,
            batch_size=run.batch_size,
            n_boot=run.n_boot,
            seed=run.seed,
            live=live,
            live_budget=live_budget,
            plots=run.plots,
            guard_folds=run.guard_folds,
        )
        pool = load_nq_open(path, data_dir=data_dir)
        items = pool[:limit] if limit is not None else pool
        with ev.progress_bar() as progress:
            result = run_guard_eval(
                items,
                pool,
                run.model_name(model),
                run.loader(model, K_STORED),
                config,
                live_backend=run.loader(model, 2),
                on_progress=ev.progress_factory(progress),
            )
    except LogTokUError as exc:
        raise toolkit.fail(exc) from exc
    typer.echo(result.report.to_markdown())
    ev.written(result.files)


_FOLDS_SEED = "Seed of the bootstrap and of the cross-validation folds."


@eval_app.command("fabricated")
@run_options(batch_size=8, seed_help=_FOLDS_SEED)
def fabricated(
    model: ModelOpt = "smollm2-135m-instruct",
    limit: Annotated[
        int | None, typer.Option(help="First N known and first N fabricated questions of each half, for a quick run.")
    ] = None,
    l2: Annotated[float, typer.Option(help="L2 penalty of the guard score's logistic regression.")] = 1.0,
    *,
    run: RunOptions,
) -> None:
    """Known vs fabricated questions: the guard score fit on the tune half, AUROC and policy rates on the test half."""
    from logtoku_eval.fabricated import dataset_name, load_fabricated
    from logtoku_eval.fabricated_eval import evaluate_fabricated, write_fabricated
    from logtoku_eval.generate import GreedySpec, greedy_cache
    from logtoku_guard.errors import LogTokUError

    run.check(limit=limit)
    cache_dir, out_dir = run.dirs()
    try:
        name = run.model_name(model)
        halves = {s: _first_of_each_kind(load_fabricated(s), limit) for s in ("tune", "test")}
        cache = greedy_cache(cache_dir, name, dataset_name(), GreedySpec())
        work = {"fabricated": [it.to_qa_item() for s in halves for it in halves[s]]}
        run.answer_missing(model, work, {"fabricated": cache}, GreedySpec())
        pairs = {s: [(cache.get(it.id), it.is_known) for it in halves[s]] for s in halves}
        report = evaluate_fabricated(pairs["tune"], pairs["test"], model=name, l2=l2, n_boot=run.n_boot, seed=run.seed)  # type: ignore[arg-type]
        files = write_fabricated(report, out_dir)
    except LogTokUError as exc:
        raise toolkit.fail(exc) from exc
    typer.echo(report.to_markdown())
    ev.written(files)


@eval_app.command("traffic")
@run_options(batch_size=16, seed_help=_FOLDS_SEED, plots=True)
def traffic(
    model: ModelOpt = "smollm2-135m-instruct",
    pass_target: Annotated[
        float, typer.Option(help="Share of correct real answers the chosen flag threshold must pass (on the tune half).")
    ] = 0.85,
    l2: Annotated[float, typer.Option(help="L2 penalty of the guard score's logistic regression.")] = 1.0,
    balance_groups: Annotated[
        bool, typer.Option(help="Weight the four groups equally in the guard's fit (default: every answer counts once).")
    ] = False,
    *,
    run: RunOptions,
) -> None:
    """Realistic traffic: correct and wrong answers to real questions, plausible and syllable-name fabrications.

    Answers as `ask` makes them; the guard is fit on the tune half (pooled over the groups), its flag
    threshold chosen there; flag rates per group with 95% CIs on the test half. Writes traffic.md,
    traffic.json and the fitted guard traffic-guard.json.
    """
    from logtoku_eval.datasets import QAItem
    from logtoku_eval.generate import SERVING, SERVING_TEMPLATE, greedy_cache
    from logtoku_eval.traffic import dataset_name
    from logtoku_eval.traffic_eval import evaluate_traffic, judge_answers, traffic_questions, write_traffic
    from logtoku_guard.calibration.prompts import shipped_calibration_questions
    from logtoku_guard.errors import ConfigurationError, LogTokUError

    run.check()
    if not 0.0 < pass_target < 1.0:
        raise toolkit.fail(ConfigurationError(f"--pass-target {pass_target!r} must be between 0 and 1, e.g. 0.85"))
    cache_dir, out_dir = run.dirs()
    try:
        name = run.model_name(model)
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
        run.answer_missing(model, work, caches, SERVING)
        pairs = [(q, caches["syllable" if q.group == "syllable" else "traffic"].get(q.id)) for q in questions]
        answers = judge_answers(pairs)  # type: ignore[arg-type]
        cal = caches["calibration"].records([it.id for it in calibration])
        report = evaluate_traffic(
            answers,
            cal,
            model=name,
            pass_target=pass_target,
            l2=l2,
            balance_groups=balance_groups,
            n_boot=run.n_boot,
            seed=run.seed,
        )
        files = write_traffic(report, out_dir, plots=run.plots)
    except LogTokUError as exc:
        raise toolkit.fail(exc) from exc
    typer.echo(report.to_markdown())
    ev.written(files)


def _first_of_each_kind(items: list[Any], limit: int | None) -> list[Any]:
    if limit is None:
        return items
    return [it for kind in ("known", "fabricated") for it in [x for x in items if x.kind == kind][:limit]]
