"""The guard commands: ``logtoku-guard calibrate`` (a model profile) and ``ask`` (a guarded answer)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from logtoku_guard.backends.base import Backend
from logtoku_guard.backends.embedded import EMBEDDED_MODEL
from logtoku_guard.cli import _common
from logtoku_guard.cli._common import BackendOpt, CacheOpt, DeviceOpt, DtypeOpt, ModelOpt, StoreOpt, TopKOpt
from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.scoring.uncertainty import DEFAULT_K, validate_k
from logtoku_guard.types import DecodingOptions, to_messages
from logtoku_guard.wire.payloads import result_payload

if TYPE_CHECKING:
    from datetime import datetime

    from logtoku_guard.audit import AuditStore
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.scoring.guard_score import GuardModel

ACTION_STYLE = {
    "pass": "green",
    "warn": "yellow",
    "retrieve": "cyan",
    "abstain": "red",
    "human_review": "magenta",
    "raise": "red",
}


def calibrate(
    model: ModelOpt = EMBEDDED_MODEL,
    top_k: TopKOpt = DEFAULT_K,
    evidence: Annotated[str, typer.Option(help="Evidence mode: clamped or raw.")] = "clamped",
    prompts: Annotated[
        Path | None,
        typer.Option(help="Prompts file: .txt (one per line) or .jsonl with 'question'. Default: the shipped calibration set."),
    ] = None,
    n: Annotated[
        int, typer.Option("--n", help="Number of shipped calibration questions (TruthfulQA + NQ-open, at most 200).")
    ] = 200,
    max_new_tokens: Annotated[int, typer.Option(help="Maximum tokens per calibration answer.")] = 64,
    batch_size: Annotated[int, typer.Option(help="Prompts per generation batch (at least 1).")] = 8,
    out_path: Annotated[
        Path | None,
        typer.Option("--out", help="Where to write the profile (default: next to the model cache); a profile there is replaced."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Let --out replace an existing file that is not a model profile.")
    ] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    cache_dir: CacheOpt = None,
    labels: Annotated[
        Path | None,
        typer.Option(help="JSONL of {question, correct: bool}: fit the guard score on your own labelled answers."),
    ] = None,
    labels_from_store: Annotated[
        str | None,
        typer.Option(
            help="Audit store (SQLite path or database URL) whose review verdicts refit the guard: approved = right, "
            "rejected or edited = wrong; the refit replaces the current guard only if strictly better out of fold, "
            "by a margin the labels support (DeLong's paired test on AUROC)."
        ),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="With --labels-from-store: only verdicts given at or after this ISO date/time (UTC).")
    ] = None,
    min_labels: Annotated[int, typer.Option(help="With --labels-from-store: fewest verdicts a refit accepts.")] = 30,
    allow_inverted: Annotated[
        bool,
        typer.Option(
            "--allow-inverted",
            help="With --labels-from-store: let a better refit replace the current guard even when the verdicts "
            "rank that guard backwards (by default such verdicts are reported and keep the current guard).",
        ),
    ] = False,
    fit_guard: Annotated[
        bool | None,
        typer.Option(
            "--fit-guard/--no-fit-guard",
            help="Fit the guard with no labels from you: answer the ~550 shipped questions whose answers are judged "
            "automatically (real ones with references, invented ones wrong by construction). Default: when no guard ships.",
        ),
    ] = None,
    risk_slack: Annotated[
        float,
        typer.Option(
            help="How close to the default policy's stated risk (80% of correct answers passed, at 90% confidence) its "
            "threshold must sit on the labelled answers to count as useful; --fit-guard answers more shipped "
            "questions until the labels support that (0.05: 149 correct answers)."
        ),
    ] = 0.05,
    backend_name: BackendOpt = "transformers",
    base_url: _common.BaseUrlOpt = None,
) -> None:
    """Profile a model over a calibration set, so policies can use quantile thresholds.

    The profile also holds the guard score, from the first of these that applies.

    With --labels FILE: fitted on your labelled questions.

    With --labels-from-store URL: refit on your reviewers' verdicts, kept only if strictly better than the current guard.

    For the embedded model: the project's shipped fit.

    For any other model: fitted on the shipped questions whose answers judge themselves (--fit-guard, the default).

    It answers more of them until the default policy's stated risk has enough correct answers (--risk-slack).

    --no-fit-guard leaves it out: guard_score is then unavailable and the default policy uses reliability.
    """
    from logtoku_guard.calibration import default_calibration_prompts, profile_path, read_prompts_file
    from logtoku_guard.calibration.guard_fit import fit_on_labels, read_labels, shipped_guard
    from logtoku_guard.calibration.thresholds import MIN_SLACK

    try:
        validate_k(top_k)
        _common.check_at_least_one(("--n", n), ("--max-new-tokens", max_new_tokens), ("--batch-size", batch_size))
        _common.check_load_options(device, cache_dir)
        _common.check_backend(backend_name, device, dtype, base_url)
        _common.check_profile_out(out_path, force)
        if not MIN_SLACK <= risk_slack < 1.0:
            msg = (
                f"--risk-slack must be a share from {MIN_SLACK} to below 1 (0.05: within 5 points of the target), "
                f"got {risk_slack}; a finer one needs tens of thousands of labels"
            )
            raise ConfigurationError(msg)
        questions = read_prompts_file(prompts) if prompts else default_calibration_prompts(n)
        if fit_guard and (labels is not None or labels_from_store is not None):
            msg = "--fit-guard fits on the shipped questions; --labels and --labels-from-store fit on yours: give one"
            raise ConfigurationError(msg)
        labelled = read_labels(labels) if labels is not None else None
        reviews = _review_store(labels, labels_from_store, since, min_labels)  # checked before the model loads
        guard: GuardModel | None
        backend = _common.load_backend(model, top_k, device, dtype, cache_dir, evidence, backend=backend_name, base_url=base_url)
        opts = DecodingOptions(max_new_tokens=max_new_tokens)
        if labels is not None and labelled is not None:
            guard = fit_on_labels(backend, labelled, opts, batch_size, source=f"labels {labels.name}")
        elif reviews is not None:
            guard = _refit_on_reviews(backend, cache_dir, *reviews, min_labels, allow_inverted)
        else:
            guard = shipped_guard(backend.model_name, backend.k, backend.evidence)
            if fit_guard or (fit_guard is None and guard is None):
                guard = _fit_self_labelled(backend, opts, batch_size, risk_slack)
        source = str(prompts or f"default ({n} questions)")
        profile = run_calibration(backend, questions, max_new_tokens, batch_size, source, guard)
        path = profile.save(out_path or profile_path(backend.model_name, backend.k, backend.evidence, cache_dir))
    except LogTokUError as exc:
        raise _common.fail(exc) from exc
    table = Table(title=f"Profile of {profile.model} ({profile.n_prompts} prompts, {profile.n_tokens} tokens)")
    table.add_column("statistic")
    for q in ("q10", "q50", "q90"):
        table.add_column(q, justify="right")
    for stat in ("reliability", "max_eu", "mean_eu", "mean_au", "first_eu", "token_au", "token_eu"):
        table.add_row(stat, *(_common.fmt(profile.quantile(stat, q)) for q in (0.1, 0.5, 0.9)))
    _common.out.print(table)
    if profile.guard is not None:
        _common.out.print(f"guard score: {profile.guard.describe()}", highlight=False, markup=False)
        _common.out.print(_label_supply_line(profile.guard, risk_slack), highlight=False, markup=False)
        for line in expected_flag_lines(profile):
            _common.out.print(line, highlight=False, markup=False)
    else:
        _common.out.print("guard score: unavailable (--no-fit-guard and no labels); policies fall back to reliability")
    _common.out.print(f"profile written to {path}", highlight=False, markup=False)


def _fit_self_labelled(backend: Backend, opts: DecodingOptions, batch_size: int, slack: float) -> GuardModel:
    """Fit the guard on the shipped self-judging questions, answering more until the default policy's stated
    risk has enough correct answers (or they run out), with a progress bar; print the groups and the supply."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from logtoku_guard.calibration.self_labels import fit_with_enough_labels, labelled_questions
    from logtoku_guard.calibration.thresholds import labels_needed
    from logtoku_guard.decision.policy import DEFAULT_CONFIDENCE, DEFAULT_COVERAGE

    questions = labelled_questions("tune")
    needed = labels_needed("coverage", DEFAULT_COVERAGE, DEFAULT_CONFIDENCE, slack)
    columns = (TextColumn("fitting the guard"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_common.err) as bar:
        task = bar.add_task("fit", total=len(questions))

        def advance(k: int) -> None:  # answers beyond the first set grow the bar
            done = bar.tasks[0].completed + k
            bar.update(task, completed=done, total=max(done, len(questions)))

        fit = fit_with_enough_labels(backend, needed, opts, batch_size, on_batch=advance)
    counts = fit.counts
    shown = ", ".join(f"{g} {n}" for g, n in counts.items())
    _common.out.print(f"guard fit on the shipped labelled questions (tune half), answers per group: {shown}", highlight=False)
    real = counts["real-correct"] + counts["real-wrong"]
    if real:  # what this model (and backend) gets right, beside what the guard flags
        share = counts["real-correct"] / real
        _common.out.print(f"accuracy on the real questions: {share:.1%} ({counts['real-correct']} of {real})", highlight=False)
    if fit.more:
        _common.out.print(
            f"{counts['real-correct'] - fit.more_correct} correct answers to the traffic questions were fewer than the "
            f"{needed} the default policy's stated risk needs: answered {fit.more} more shipped questions (ordinary "
            f"questions, tune half), {fit.more_correct} right",
            highlight=False,
        )
    if not fit.met:
        _common.out.print(
            f"could not reach {needed} correct answers with the shipped questions ({counts['real-correct']}): the default "
            "policy's threshold is placed on fewer and is lenient; label more with --labels, or raise --risk-slack",
            highlight=False,
        )
    return fit.guard


def _label_supply_line(guard: GuardModel, slack: float) -> str:
    """Whether the guard's labelled correct answers support the default policy's stated risk usefully."""
    from logtoku_guard.calibration.thresholds import coverage_supply
    from logtoku_guard.decision.policy import DEFAULT_CONFIDENCE, DEFAULT_COVERAGE

    correct, _ = guard.labelled_scores()
    supply = coverage_supply(len(correct), DEFAULT_COVERAGE, DEFAULT_CONFIDENCE, slack)
    return f"labels for the default policy's stated risk: {supply.describe()}"


def _review_store(
    labels: Path | None, url: str | None, since: str | None, min_labels: int
) -> tuple[AuditStore, datetime | None] | None:
    """The audit store of ``--labels-from-store`` and the ``--since`` time, checked (None without the option)."""
    if url is None:
        if since is not None:
            msg = "--since filters the verdicts of --labels-from-store; give the store too"
            raise ConfigurationError(msg)
        return None
    if labels is not None:
        msg = "give --labels (a JSONL file) or --labels-from-store (reviewers' verdicts), not both"
        raise ConfigurationError(msg)
    if min_labels < 10:
        msg = f"--min-labels must be at least 10 (a guard fit on fewer is noise), got {min_labels}"
        raise ConfigurationError(msg)
    when = _common.parse_since(since)
    store = _common.open_store(url, read_only=True)
    try:
        decided = store.count_decided(since=when)
        if decided < min_labels:
            window = f" since {since}" if since else ""
            msg = f"the store holds {decided} review verdicts{window}; a refit needs at least {min_labels}"
            raise ConfigurationError(msg)
    except BaseException:
        store.close()
        raise
    return store, when


def _refit_on_reviews(
    backend: Backend,
    cache_dir: Path | None,
    store: AuditStore,
    since: datetime | None,
    min_labels: int,
    allow_inverted: bool = False,
) -> GuardModel | None:
    """Refit the guard on the store's verdicts for this model (streamed); print what the labels look like,
    before and after, and the verdict; the guard to keep."""
    from logtoku_guard.calibration import find_profile_for
    from logtoku_guard.calibration.guard_fit import shipped_guard
    from logtoku_guard.calibration.review_labels import read_label_matrix, refit_on_reviews
    from logtoku_guard.scoring.guard_score import FEATURES

    found = find_profile_for(backend.model_name, backend.k, backend.evidence, cache_dir)
    current = found[0].guard if found is not None and found[0].guard is not None else None
    current = current or shipped_guard(backend.model_name, backend.k, backend.evidence)
    try:
        features = current.features if current is not None else FEATURES
        labels = read_label_matrix(store, backend.model_name, features=features, since=since)
    finally:
        store.close()
    from logtoku_guard.cli.audit import report_skipped

    report_skipped(labels.skipped)
    refit = refit_on_reviews(current, labels, min_labels=min_labels, allow_inverted=allow_inverted)
    for line in refit.lines():
        _common.out.print(line, highlight=False, markup=False)
    return refit.guard if refit.replace else current


def expected_flag_lines(profile: ModelProfile) -> list[str]:
    """For each rule of the default policy on ``guard_score``: its threshold (and where that lies in
    this profile) and the share of each group of the guard's fit data it flags (out of fold)."""
    from logtoku_guard.decision.conditions import Compare, resolve_threshold
    from logtoku_guard.decision.policy import default_policy

    lines = []
    guard = profile.guard
    for rule in default_policy().rules:
        c = rule.when
        if guard is None or not isinstance(c, Compare) or c.stat != "guard_score":
            continue
        try:
            t, _, guarantee = resolve_threshold(c, profile)
        except ConfigurationError as exc:  # e.g. too few labelled correct answers for its coverage target
            lines.append(f"default policy: its guard_score threshold cannot be placed on this profile: {exc}")
            continue
        if guarantee is not None:
            lines.append(f"default policy threshold: {guarantee}")
        where = ", ".join(_flag_rate(g, scores, t) for g, scores in sorted(guard.reference_scores.items()) if scores)
        lines.append(
            f"default policy: {rule.action} when guard_score {c.op} {t:.4f} (quantile "
            f"{profile.percentile('guard_score', t):.3f} of this profile); expected flag rate per group of the "
            f"guard's fit data (out of fold, 95% Clopper-Pearson interval): {where or 'no reference scores in this guard'}"
        )
    return lines


def _flag_rate(group: str, scores: list[float], threshold: float) -> str:
    """``group 75% [68, 81]``: the share of ``scores`` below ``threshold`` (NaN counts as flagged) and its interval."""
    from logtoku_guard.scoring.risk import clopper_pearson

    flagged, n = sum(1 for v in scores if not v >= threshold), len(scores)
    lo, hi = clopper_pearson(flagged, n, 0.025, "lower"), clopper_pearson(flagged, n, 0.025, "upper")
    return f"{group} {100 * flagged / n:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]"


def run_calibration(
    backend: Backend, questions: list[str], max_new_tokens: int, batch_size: int, source: str, guard: Any = None
) -> ModelProfile:
    """Calibrate with a progress bar on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from logtoku_guard.calibration import calibrate as run

    columns = (TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_common.err) as bar:
        task = bar.add_task("calibrate", total=len(questions))
        return run(
            backend,
            questions,
            DecodingOptions(max_new_tokens=max_new_tokens),
            batch_size=batch_size,
            source=source,
            on_batch=lambda k: bar.advance(task, k),
            guard=guard,
        )


def ask(
    prompt: Annotated[str, typer.Argument(help="The question to answer.")],
    policy: Annotated[
        Path | None,
        typer.Option(
            help="Policy file (YAML or JSON) or a shipped policy's name (default, cascade). Default: the calibrated default."
        ),
    ] = None,
    profile: Annotated[Path | None, typer.Option(help="Model profile JSON (default: the saved profile of --model).")] = None,
    context_file: Annotated[
        Path | None, typer.Option(help="Passages (blank-line separated) for the retrieve action, ranked by BM25.")
    ] = None,
    store: StoreOpt = None,
    model: ModelOpt = EMBEDDED_MODEL,
    top_k: TopKOpt = DEFAULT_K,
    max_new_tokens: Annotated[
        int,
        typer.Option(help="Maximum number of generated tokens (64: the length the profile and the shipped guard were fit on)."),
    ] = 64,
    system: Annotated[str | None, typer.Option(help="System message.")] = None,
    calibration_size: Annotated[
        int, typer.Option(help="Shipped questions used when the model has no profile yet and one is made (at most 200).")
    ] = 200,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    cache_dir: CacheOpt = None,
    backend_name: BackendOpt = "transformers",
    base_url: _common.BaseUrlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Answer PROMPT through the guard: pass, warn, retrieve, abstain or send to human review."""
    from logtoku_guard.calibration import default_calibration_prompts, profile_path
    from logtoku_guard.decision.policy import Policy, default_policy
    from logtoku_guard.decision.results import GuardRejectedError
    from logtoku_guard.guard.guard import Guard

    try:
        to_messages(prompt, system)
        validate_k(top_k)
        _common.check_load_options(device, cache_dir)
        _common.check_backend(backend_name, device, dtype, base_url)
        rules = Policy.load(policy) if policy else default_policy()
        retriever = _common.read_context_file(context_file) if context_file else None
        audit = _common.open_store(store, cache_dir)
        explicit = _common.read_profile(profile, model, top_k, "clamped") if profile else None
        backend = _common.load_backend(model, top_k, device, dtype, cache_dir, backend=backend_name, base_url=base_url)
        prof, _ = _common.profile_for(backend, explicit, profile, cache_dir)
        if prof is None and (rules.uses_quantiles() or rules.rules):
            path = profile_path(backend.model_name, backend.k, backend.evidence, cache_dir)
            _common.err.print(
                f"No profile for {backend.model_name} yet: calibrating once on {calibration_size} questions (saved to {path})."
            )
            from logtoku_guard.calibration.guard_fit import shipped_guard

            shipped = shipped_guard(backend.model_name, backend.k, backend.evidence)
            questions = default_calibration_prompts(calibration_size)
            prof = run_calibration(backend, questions, 64, 8, f"default ({calibration_size})", shipped)
            prof.save(path)
        guard = Guard(
            backend,
            rules,
            retriever=retriever,
            store=audit,
            profile=prof,
            options=DecodingOptions(max_new_tokens=max_new_tokens),
            system=system,
        )
        try:
            result = guard.run(prompt)
        except GuardRejectedError as exc:
            result = exc.result
    except LogTokUError as exc:
        raise _common.fail(exc) from exc
    percentile = _common.reliability_percentile(guard.profile, result.generation)
    if as_json:
        _common.print_json({**result_payload(result, guard.quadrants), "reliability_percentile": percentile})
        return
    thresholds = guard.quadrants or _common.answer_median(result.generation)
    _common.render_generation(result.generation, thresholds, percentile)
    d = result.decision
    score = d.stats.as_dict().get("guard_score")
    # rule names, reasons and answers come from the policy file and the model: printed through safe_text
    # (no markup read, ESC and U+202E shown as escapes), never as markup
    _common.out.print(
        _common.safe_text(
            (
                f"Guard score: {score:.4g} (the answer's predicted probability of being right)"
                if isinstance(score, float) and math.isfinite(score)
                else "Guard score: - (the profile has no fitted guard)"
            )
            + "; "
            + ("; ".join(c.describe() for c in d.checks) if d.checks else f"no rule fired ({_thresholds(guard.policy)})")
        ),
        highlight=False,
    )
    _common.out.print(
        Text("Action: ")
        + _common.safe_text(result.action, style=ACTION_STYLE.get(result.action, ""))
        + _common.safe_text(
            f" (rule: {d.rule or '-'}; {d.reason}); attempts: {len(result.attempts)}; trace: {result.trace_id}"
            + (f"; review id: {result.review_id}" if result.review_id is not None else "")
        ),
        highlight=False,
    )
    _common.out.print(Text("Returned: ", style="bold") + _common.safe_text(result.answer))


def _thresholds(policy: Policy) -> str:
    """The policy's top-level comparisons (``guard_score < 0.2797``), for an answer no rule flagged."""
    from logtoku_guard.decision.conditions import Compare, Quantile

    def shown_value(value: Any) -> str:
        if isinstance(value, float):
            return f"{value}"
        if isinstance(value, Quantile):
            return f"quantile {value.quantile:g} of the profile"
        return f"the threshold for {value.kind} {value.target:g} at confidence {value.confidence:g}"

    compared = [(r.name, r.when) for r in policy.rules if isinstance(r.when, Compare)]
    shown = [f"{name}: {when.stat} {when.op} {shown_value(when.value)}" for name, when in compared]
    return "; ".join(shown) or "its rules compare no single statistic"
