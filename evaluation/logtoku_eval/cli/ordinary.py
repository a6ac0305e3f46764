"""``logtoku-guard eval ordinary``: the shipped guard and policy, as they are, on ordinary questions
(:mod:`logtoku_eval.ordinary_eval`), beside the traffic benchmark's real questions.

As the other command modules, only typer, rich and the core CLI's public toolkit are imported
here; the evaluation harness is imported inside the command.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer

from logtoku_eval.cli import common as ev
from logtoku_eval.cli.common import ModelOpt, RunOptions, eval_app, run_options
from logtoku_guard.cli import toolkit

SPLIT_CHOICES = ("tune", "test", "all")
MAX_NEW_TOKENS = 8192
"""Most --max-new-tokens (the embedded model's context window)."""


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
    temperature: Annotated[
        float,
        typer.Option(
            help="Sampling temperature of the answers: 0 (the default) is greedy, as `ask` and `serve` answer; 1 samples "
            "as OpenAI's default (serve --default-temperature 1) does. Each question's answer is "
            "drawn from its own stream seeded by --sample-seed and the question's id."
        ),
    ] = 0.0,
    max_new_tokens: Annotated[
        int,
        typer.Option(
            help="Most tokens of an answer: 64 (the default) as `ask` and `serve`; 256 is what `serve "
            "--default-max-tokens 256` gives a request that sends no max_tokens."
        ),
    ] = 64,
    sample_seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of the sampled answers (with --temperature above 0; default 0): the same seed draws the same "
            "answers, whatever the batch size or --limit. The decoding names the generation cache file, so greedy "
            "answers and each temperature, length and seed are cached apart."
        ),
    ] = None,
    *,
    run: RunOptions,
) -> None:
    """Ordinary questions in three wordings: the shipped guard's flags on correct and wrong answers, per wording.

    Answers as `ask` makes them by default (the question alone, greedy, 64 tokens; --temperature 1
    --max-new-tokens 256 answers as `serve` with OpenAI's defaults), judged by nq-match against the
    accepted answers; the profile's guard and the policy decide each answer as in `ask` (nothing refit).
    Prints wrong answers flagged, correct answers passed and the guard_score AUROC per wording and overall,
    with 95% intervals resampling questions. Writes ordinary.md, ordinary.json and ordinary-answers.jsonl
    (every answer with its judgment, decision and first-pass statistics).
    """
    from logtoku_eval.datasets import QAItem
    from logtoku_eval.generate import SERVING_TEMPLATE, greedy_cache
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
    try:
        spec = answer_spec(temperature, max_new_tokens, sample_seed)
    except ConfigurationError as exc:
        raise toolkit.fail(exc) from exc
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
        caches = {"ordinary": greedy_cache(cache_dir, name, dataset_name(), spec, template=SERVING_TEMPLATE)}
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
            caches["traffic"] = greedy_cache(cache_dir, name, traffic_dataset(), spec, template=SERVING_TEMPLATE)
        run.answer_missing(model, work, caches, spec)
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
            decoding=describe_spec(spec),
            traffic=traffic_answers,
            n_boot=run.n_boot,
            seed=run.seed,
        )
        files = write_ordinary(report, out_dir)
    except LogTokUError as exc:
        raise toolkit.fail(exc) from exc
    typer.echo(report.to_markdown())
    ev.written(files)


def answer_spec(temperature: float, max_new_tokens: int, sample_seed: int | None) -> Any:
    """The decoding of ``--temperature``, ``--max-new-tokens`` and ``--sample-seed``, checked (a
    :class:`~logtoku_guard.errors.ConfigurationError` names the bad value and the fix): a
    :class:`~logtoku_eval.generate.GreedySpec` at a temperature below
    :data:`~logtoku_guard.types.GREEDY_BELOW` (every backend decodes that greedily), else a
    :class:`~logtoku_eval.generate.SampledSpec`; no stop string either way, as `ask` and `serve`."""
    from logtoku_eval.generate import GreedySpec, SampledSpec
    from logtoku_guard.errors import ConfigurationError
    from logtoku_guard.types import GREEDY_BELOW

    if not (math.isfinite(temperature) and temperature >= 0):
        msg = f"--temperature {temperature!r} is out of range; give a finite number >= 0 (0: greedy, 1: OpenAI's default)"
        raise ConfigurationError(msg)
    if max_new_tokens < 1 or max_new_tokens > MAX_NEW_TOKENS:
        msg = (
            f"--max-new-tokens {max_new_tokens} is out of range; give a number of tokens from 1 to {MAX_NEW_TOKENS} "
            "(64: as `ask` and `serve`, 256: serve --default-max-tokens 256)"
        )
        raise ConfigurationError(msg)
    if sample_seed is not None and not 0 <= sample_seed <= toolkit.SEED_MAX:
        msg = f"--sample-seed {sample_seed} is out of range; give an integer from 0 to {toolkit.SEED_MAX}"
        raise ConfigurationError(msg)
    if temperature < GREEDY_BELOW:
        if sample_seed is not None:
            msg = (
                f"--sample-seed {sample_seed} seeds sampled answers, but --temperature {temperature!r} is greedy; "
                f"give a --temperature of at least {GREEDY_BELOW} or leave out --sample-seed"
            )
            raise ConfigurationError(msg)
        return GreedySpec(max_new_tokens=max_new_tokens, stop=())
    return SampledSpec(temperature=temperature, max_new_tokens=max_new_tokens, seed=sample_seed or 0, stop=())


def describe_spec(spec: Any) -> str:
    """The decoding in words, for the report (``greedy, at most 64 tokens``)."""
    from logtoku_eval.generate import SampledSpec

    if isinstance(spec, SampledSpec):
        return f"sampled at temperature {spec.temperature:g} (top-p 1, seed {spec.seed}), at most {spec.max_new_tokens} tokens"
    return f"greedy, at most {spec.max_new_tokens} tokens"


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
