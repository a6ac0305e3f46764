"""``logtoku-guard eval ordinary``: the shipped guard and policy, as they are, on ordinary questions
(:mod:`logtoku_eval.ordinary_eval`), beside the traffic benchmark's real questions.

As the other command modules, only typer, rich and the core CLI's public toolkit are imported
here; the evaluation harness is imported inside the command.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

from logtoku_eval.cli import common as ev
from logtoku_eval.cli.common import ModelOpt, RunOptions, eval_app, run_options
from logtoku_guard.cli import toolkit

SPLIT_CHOICES = ("tune", "test", "all")


@eval_app.command("ordinary")
@run_options(batch_size=16, seed_help="Seed of the bootstrap (which resamples questions).")
def ordinary(
    model: ModelOpt = "smollm2-135m-instruct",
    split: Annotated[str, typer.Option(help="Half to report: test (the default), tune or all.")] = "test",
    limit: Annotated[
        int | None,
        typer.Option(
            help="Only the first N questions of each category of the half (each in its three wordings), and the "
            "first N known-fact and N NQ-open questions of the traffic half (each in both styles), for a quick run "
            "that keeps every category; a larger N reuses the answers of a smaller one."
        ),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            help="Profile whose guard decides (a JSON saved by `logtoku-guard calibrate`). Default: the profile "
            "shipped for the model; nothing is refit."
        ),
    ] = None,
    policy: Annotated[
        Path | None,
        typer.Option(help="Policy file (YAML or JSON) or a shipped policy's name (cascade). Default: the default policy."),
    ] = None,
    traffic: Annotated[
        bool,
        typer.Option(
            "--traffic/--no-traffic",
            help="Also report the traffic benchmark's real questions of the same half (answered and cached as "
            "`eval traffic` does; the first run generates them).",
        ),
    ] = True,
    *,
    run: RunOptions,
) -> None:
    """Ordinary questions in three wordings: the shipped guard's flags on correct and wrong answers, per wording.

    Answers as `ask` makes them (the question alone, greedy, 64 tokens), judged by nq-match against the
    accepted answers; the profile's guard and the policy decide each answer as in `ask` (nothing refit).
    Prints wrong answers flagged, correct answers passed and the guard_score AUROC per wording and overall,
    with 95% intervals resampling questions. Writes ordinary.md, ordinary.json and ordinary-answers.jsonl
    (every answer with its judgment, decision and first-pass statistics).
    """
    from logtoku_eval.datasets import QAItem
    from logtoku_eval.generate import SERVING, SERVING_TEMPLATE, greedy_cache
    from logtoku_eval.ordinary import dataset_name, load_ordinary
    from logtoku_eval.ordinary_eval import QuestionRef, evaluate_ordinary, policy_threshold, score_answers, write_ordinary
    from logtoku_eval.traffic import dataset_name as traffic_dataset
    from logtoku_eval.traffic import load_traffic
    from logtoku_eval.traffic_eval import STYLES
    from logtoku_guard.calibration.profiles import ModelProfile, shipped_profile_path
    from logtoku_guard.decision.policy import Policy, default_policy
    from logtoku_guard.errors import ConfigurationError, LogTokUError

    run.check(limit=limit)
    if split not in SPLIT_CHOICES:
        raise toolkit.fail(ConfigurationError(f"--split must be one of {', '.join(SPLIT_CHOICES)}, got {split!r}"))
    cache_dir, out_dir = run.dirs()
    try:
        name = run.model_name(model)
        profile_file = profile if profile is not None else shipped_profile_path(name)
        if not profile_file.is_file():
            msg = (
                f"no profile at {str(profile_file)!r} (none is shipped for the model {name!r}); pass --profile with one "
                f"saved by `logtoku-guard calibrate --model {model} --out FILE`"
            )
            raise ConfigurationError(msg)
        try:
            chosen_profile = ModelProfile.load(profile_file)
        except (ValueError, OSError) as exc:  # pydantic's ValidationError is a ValueError
            msg = (
                f"--profile {str(profile_file)!r} is not a profile saved by `logtoku-guard calibrate` ({exc.__class__.__name__})"
            )
            raise ConfigurationError(msg) from exc
        chosen_policy = Policy.load(policy) if policy is not None else default_policy()
        items = load_ordinary(split=split)
        if limit is not None:
            keep = _first_of_each(((it.category, it.question_id) for it in items), limit)
            items = [it for it in items if it.question_id in keep]
        questions = [QuestionRef.of_ordinary(it) for it in items]
        work = {"ordinary": [it.to_qa_item() for it in items]}
        caches = {"ordinary": greedy_cache(cache_dir, name, dataset_name(), SERVING, template=SERVING_TEMPLATE)}
        traffic_refs: list[QuestionRef] = []
        if traffic:
            real = [it for it in load_traffic(split=split) if it.group == "real"]
            if limit is not None:
                bases = _first_of_each(((it.source, _base_id(it.id)) for it in real), limit)
                real = [it for it in real if _base_id(it.id) in bases]
            traffic_refs = [
                QuestionRef(
                    "traffic", it.id, _base_id(it.id), it.category, it.split, STYLES[it.category], it.question, it.answers
                )
                for it in real
            ]
            work["traffic"] = [QAItem(it.id, it.question, it.answers) for it in real]
            caches["traffic"] = greedy_cache(cache_dir, name, traffic_dataset(), SERVING, template=SERVING_TEMPLATE)
        run.answer_missing(model, work, caches, SERVING)
        kwargs = {"model": name, "profile": chosen_profile, "policy": chosen_policy}
        answers = score_answers(questions, caches["ordinary"].records([q.id for q in questions]), **kwargs)  # type: ignore[arg-type]
        traffic_answers = (
            score_answers(traffic_refs, caches["traffic"].records([q.id for q in traffic_refs]), **kwargs)  # type: ignore[arg-type]
            if traffic
            else []
        )
        report = evaluate_ordinary(
            answers,
            model=name,
            profile=str(profile_file) if profile is not None else f"shipped ({profile_file.name})",
            policy=f"{chosen_policy.name} v{chosen_policy.version}",
            threshold=policy_threshold(chosen_policy, chosen_profile),
            split=split,
            traffic=traffic_answers,
            n_boot=run.n_boot,
            seed=run.seed,
        )
        files = write_ordinary(report, out_dir)
    except LogTokUError as exc:
        raise toolkit.fail(exc) from exc
    typer.echo(report.to_markdown())
    ev.written(files)


def _first_of_each(pairs: Iterable[tuple[str, str]], limit: int) -> set[str]:
    """The first ``limit`` distinct ids of each group, from (group, id) pairs in file order."""
    seen: dict[str, list[str]] = {}
    for group, ident in pairs:
        ids = seen.setdefault(group, [])
        if ident not in ids and len(ids) < limit:
            ids.append(ident)
    return {i for ids in seen.values() for i in ids}


def _base_id(traffic_id: str) -> str:
    """A traffic question's id without its restyled twin's suffix (``known-012-lower`` -> ``known-012``)."""
    for suffix in ("-lower", "-cased"):
        if traffic_id.endswith(suffix):
            return traffic_id[: -len(suffix)]
    return traffic_id
