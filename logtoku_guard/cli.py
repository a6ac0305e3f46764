"""The ``logtoku-guard`` command line (typer + rich).

typer gives typed options and ``--help`` from the signatures; rich gives the coloured
tokens, tables and the spinner while a model loads or converts.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from logtoku_guard.embedded import EMBEDDED_MODEL
from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.types import DecodingOptions, DynamicTemperature, Generation, to_messages
from logtoku_guard.uncertainty import DEFAULT_K, DEFAULT_TOP_N, Quadrant, QuadrantThresholds, validate_k

app = typer.Typer(
    help="LogTokU: per-token aleatoric (AU) and epistemic (EU) uncertainty of a local LLM, in one pass.",
    no_args_is_help=True,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the library does (to stderr).")] = False,
) -> None:
    """LogTokU: per-token aleatoric (AU) and epistemic (EU) uncertainty of a local LLM, in one pass."""
    import logging

    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


QUADRANT_STYLE = {Quadrant.I: "bold red", Quadrant.II: "bold yellow", Quadrant.III: "green", Quadrant.IV: "cyan"}

ModelOpt = Annotated[
    str,
    typer.Option(help=f"Model: {EMBEDDED_MODEL!r} (embedded default), a local folder, a .gguf file, or a cached hub id."),
]
TopKOpt = Annotated[int, typer.Option("--top-k", "-k", help="Number K of top raw logits per token (K >= 2).")]
DeviceOpt = Annotated[str, typer.Option(help="Device: auto, cpu, cuda, cuda:N.")]
DtypeOpt = Annotated[str, typer.Option(help="Weights dtype: auto, float32, bfloat16, float16.")]
CacheOpt = Annotated[
    Path | None,
    typer.Option(help="Cache folder for the converted embedded model (default: $LOGTOKU_GUARD_CACHE or the user cache dir)."),
]


def load_backend(
    model: str, k: int, device: str, dtype: str, cache_dir: Path | None, evidence: str = "clamped", top_n: int = DEFAULT_TOP_N
) -> Any:
    """Load a TransformersBackend with a spinner on stderr (stdout stays clean for --json)."""
    from transformers.utils import logging as hf_logging

    from logtoku_guard.backends.transformers import TransformersBackend

    hf_logging.disable_progress_bar()
    with err.status(f"Loading {model}...") as status:
        return TransformersBackend(
            model,
            k=k,
            evidence=evidence,  # type: ignore[arg-type]
            top_n=top_n,
            device=device,
            dtype=dtype,
            cache_dir=cache_dir,
            progress=lambda message: status.update(message + "..."),
        )


def _cli_thresholds(au: float | None, eu: float | None) -> QuadrantThresholds | None:
    """``--au-threshold/--eu-threshold``: both or neither (checked before any model loads)."""
    if (au is None) != (eu is None):
        msg = "give both --au-threshold and --eu-threshold, or neither"
        raise typer.BadParameter(msg)
    if au is None or eu is None:
        return None
    return QuadrantThresholds(au, eu, source="command line")


def _thresholds(generation: Generation, au: float | None, eu: float | None) -> QuadrantThresholds:
    """Thresholds from the command line, else the median of this answer's own tokens (uncalibrated)."""
    given = _cli_thresholds(au, eu)
    if given is not None:
        return given
    tokens = generation.tokens
    if not tokens:
        return QuadrantThresholds(0.0, 0.0, source="no tokens")
    return QuadrantThresholds.from_quantile(
        [t.au for t in tokens], [t.eu for t in tokens], 0.5, source="median of this answer (uncalibrated)"
    )


def _calibrate_hint(model: str, k: int, evidence: str, out_path: Path | None = None) -> str:
    extra = "" if evidence == "clamped" else f" --evidence {evidence}"
    dest = f" --out {out_path}" if out_path is not None else ""
    return f"`logtoku-guard calibrate --model {model} --top-k {k}{extra}{dest}`"


def _read_profile(path: Path, model: str, k: int, evidence: str) -> Any:
    """An explicit ``--profile``, read before any model loads so a bad path fails at once."""
    from pydantic import ValidationError

    from logtoku_guard.calibration import ModelProfile

    if not path.is_file():
        msg = (
            f"--profile {str(path)!r} does not exist; write it with {_calibrate_hint(model, k, evidence, path)}, "
            "or leave out --profile to use the saved profile of --model"
        )
        raise ConfigurationError(msg)
    try:
        return ModelProfile.load(path)
    except (ValidationError, OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, ValidationError):
            e = exc.errors()[0]
            first = f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
        else:
            first = str(exc)
        msg = (
            f"--profile {str(path)!r} is not a model profile ({first}); "
            f"give a file written by {_calibrate_hint(model, k, evidence)}"
        )
        raise ConfigurationError(msg) from exc


def _profile_for(backend: Any, explicit: Any, explicit_path: Path | None, cache_dir: Path | None) -> tuple[Any, Path | None]:
    """The profile for ``backend`` and its path, shared by ``score`` and ``ask``; never calibrates.

    ``--profile`` (which must match the backend's model, K and evidence mode), else the saved
    profile of the model, else ``(None, None)``.
    """
    from pydantic import ValidationError

    from logtoku_guard.calibration import load_profile_for, profile_path

    model, k, evidence = backend.model_name, backend.k, backend.evidence
    if explicit is not None:
        try:
            explicit.check_matches(model, k, evidence)
        except ConfigurationError as exc:
            msg = f"--profile {str(explicit_path)!r}: {exc}, or leave out --profile to use the saved profile of --model"
            raise ConfigurationError(msg) from exc
        return explicit, explicit_path
    path = profile_path(model, k, evidence, cache_dir)
    try:
        found = load_profile_for(model, k, evidence, cache_dir)
    except (ValidationError, OSError, UnicodeDecodeError) as exc:
        msg = (
            f"the saved profile {str(path)!r} cannot be read ({exc.__class__.__name__}); "
            f"remake it with {_calibrate_hint(model, k, evidence)}"
        )
        raise ConfigurationError(msg) from exc
    return (found, path) if found is not None else (None, None)


def _profile_thresholds(profile: Any, path: Path | None) -> QuadrantThresholds:
    """Quadrant thresholds of ``profile`` at the default policy's quadrant quantiles (as ``ask`` uses)."""
    from logtoku_guard.policy import default_policy

    q = default_policy().quadrants
    t = profile.quadrant_thresholds(q.au_quantile, q.eu_quantile)
    return dataclasses.replace(t, source=f"profile {path} (AU q{q.au_quantile:g}, EU q{q.eu_quantile:g})")


def _fmt(x: float, digits: int = 4) -> str:
    return "nan" if math.isnan(x) else f"{x:.{digits}f}"


def reliability_percentile(profile: Any, generation: Generation) -> float | None:
    """Where the answer's reliability falls in the profile's calibration set (0-100), if comparable.

    ``None`` without a profile, or when the profile averaged another number of tokens
    (``top_n``) into its reliability.
    """
    if profile is None or profile.top_n != generation.top_n:
        return None
    p = profile.percentile("reliability", generation.score.reliability)
    return None if math.isnan(p) else 100.0 * p


def render_generation(generation: Generation, thresholds: QuadrantThresholds, percentile: float | None = None) -> None:
    """Answer with tokens coloured by quadrant, a per-token table and the reliability."""
    answer = Text()
    for t in generation.tokens:
        answer.append(t.text, style=QUADRANT_STYLE[thresholds.classify(t.au, t.eu)])
    out.print(Text("Answer: ", style="bold") + answer)
    table = Table(title=f"Per-token uncertainty (K={generation.k}, {generation.evidence} evidence)", show_lines=False)
    for col, justify in [
        ("#", "right"),
        ("token", "left"),
        ("AU", "right"),
        ("EU", "right"),
        ("AU*EU", "right"),
        ("quadrant", "center"),
        ("log p", "right"),
        ("entropy", "right"),
    ]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for t in generation.tokens:
        q = thresholds.classify(t.au, t.eu)
        table.add_row(
            str(t.index),
            repr(t.text),
            _fmt(t.au),
            _fmt(t.eu),
            _fmt(t.uncertainty),
            Text(q.value, style=QUADRANT_STYLE[q]),
            _fmt(t.logprob, 3),
            _fmt(t.entropy, 3),
        )
    out.print(table)
    s = generation.score
    out.print(
        f"Response reliability (top-{s.top_n} mean, higher = more reliable): [bold]{_fmt(s.reliability)}[/]"
        + (f" (percentile {percentile:.0f} of the model's profile)" if percentile is not None else "")
        + f"   plain mean: {_fmt(s.reliability_mean)}   tokens: {s.n_tokens}   finish: {generation.finish_reason}"
    )
    out.print(
        f"Quadrant thresholds AU > {thresholds.au:.4f}, EU > {thresholds.eu:.4f} ({thresholds.source}); "
        + "  ".join(f"[{QUADRANT_STYLE[q]}]{q.value}[/]: {q.description}" for q in Quadrant),
        highlight=False,
    )


@app.command()
def score(
    prompt: Annotated[str, typer.Argument(help="The question to answer.")],
    model: ModelOpt = EMBEDDED_MODEL,
    top_k: TopKOpt = DEFAULT_K,
    max_new_tokens: Annotated[int, typer.Option(help="Maximum number of generated tokens.")] = 128,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (with --temperature > 0 or --dynamic).")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Random seed for sampled decoding.")] = None,
    dynamic: Annotated[
        bool, typer.Option("--dynamic", help="Dynamic decoding: temperature falls from --t-max to --t-min as EU rises.")
    ] = False,
    t_max: Annotated[float, typer.Option(help="Dynamic decoding: temperature at EU -> 0.")] = 1.0,
    t_min: Annotated[float, typer.Option(help="Dynamic decoding: temperature at EU = 1.")] = 0.1,
    system: Annotated[str | None, typer.Option(help="System message.")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="Stop string (repeatable); not included in the answer.")] = None,
    evidence: Annotated[
        str, typer.Option(help="Evidence mode: clamped (default) or raw (reference reproduction; may give NaN).")
    ] = "clamped",
    top_n: Annotated[int, typer.Option(help="Least reliable tokens averaged into the response reliability.")] = DEFAULT_TOP_N,
    au_threshold: Annotated[
        float | None,
        typer.Option(help="AU threshold for quadrants (default: from the model's profile, else median of this answer)."),
    ] = None,
    eu_threshold: Annotated[
        float | None,
        typer.Option(help="EU threshold for quadrants (default: from the model's profile, else median of this answer)."),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(help="Model profile JSON for the quadrant thresholds (default: the saved profile of --model, if any)."),
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    cache_dir: CacheOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the coloured view.")] = False,
) -> None:
    """Answer PROMPT and show every token's AU/EU, its quadrant and the response reliability.

    Quadrant thresholds: --au-threshold/--eu-threshold, else the model's profile (--profile or
    the one `logtoku-guard calibrate` saved), else the median of this answer (uncalibrated).
    """
    given = _cli_thresholds(au_threshold, eu_threshold)
    try:
        to_messages(prompt, system)  # fail on a bad prompt before spending seconds on loading
        validate_k(top_k)
        explicit = _read_profile(profile, model, top_k, evidence) if profile else None
        options = DecodingOptions(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=tuple(stop or ()),
            dynamic=DynamicTemperature(t_max=t_max, t_min=t_min) if dynamic else None,
        )
        backend = load_backend(model, top_k, device, dtype, cache_dir, evidence, top_n)
        prof, prof_path = _profile_for(backend, explicit, profile, cache_dir) if given is None or explicit else (None, None)
        thresholds = given or (_profile_thresholds(prof, prof_path) if prof is not None else None)
        generation = backend.generate(prompt, options, system=system)
    except LogTokUError as exc:
        raise _fail(exc) from exc
    if thresholds is None:
        thresholds = _thresholds(generation, None, None)
    percentile = reliability_percentile(prof, generation)
    if as_json:
        data = generation.to_dict(thresholds)
        data["profile"] = str(prof_path) if prof is not None and given is None else None
        data["reliability_percentile"] = percentile
        print_json(data)
    else:
        render_generation(generation, thresholds, percentile)


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc}", highlight=False)
    return typer.Exit(2)


@app.command()
def calibrate(
    model: ModelOpt = EMBEDDED_MODEL,
    top_k: TopKOpt = DEFAULT_K,
    evidence: Annotated[str, typer.Option(help="Evidence mode: clamped or raw.")] = "clamped",
    prompts: Annotated[
        Path | None, typer.Option(help="Prompts file: .txt (one per line) or .jsonl with 'question'. Default: shared datasets.")
    ] = None,
    n: Annotated[int, typer.Option("--n", help="Number of default calibration questions (TruthfulQA + NQ-open).")] = 200,
    max_new_tokens: Annotated[int, typer.Option(help="Maximum tokens per calibration answer.")] = 64,
    batch_size: Annotated[int, typer.Option(help="Prompts per generation batch.")] = 8,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="Where to write the profile (default: next to the model cache).")
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    cache_dir: CacheOpt = None,
) -> None:
    """Profile a model over a calibration set so policies can use quantile thresholds."""
    from logtoku_guard.calibration import default_calibration_prompts, profile_path, read_prompts_file

    try:
        questions = read_prompts_file(prompts) if prompts else default_calibration_prompts(n)
        validate_k(top_k)
        backend = load_backend(model, top_k, device, dtype, cache_dir, evidence)
        profile = run_calibration(backend, questions, max_new_tokens, batch_size, str(prompts or f"default ({n} questions)"))
        path = profile.save(out_path or profile_path(backend.model_name, backend.k, backend.evidence, cache_dir))
    except LogTokUError as exc:
        raise _fail(exc) from exc
    table = Table(title=f"Profile of {profile.model} ({profile.n_prompts} prompts, {profile.n_tokens} tokens)")
    table.add_column("statistic")
    for q in ("q10", "q50", "q90"):
        table.add_column(q, justify="right")
    for stat in ("reliability", "max_eu", "mean_eu", "mean_au", "first_eu"):
        table.add_row(stat, *(_fmt(profile.quantile(stat, q)) for q in (0.1, 0.5, 0.9)))
    for stat in ("token_au", "token_eu"):
        table.add_row(stat, *(_fmt(profile.quantile(stat, q)) for q in (0.1, 0.5, 0.9)))
    out.print(table)
    out.print(f"profile written to {path}")


def run_calibration(backend: Any, questions: list[str], max_new_tokens: int, batch_size: int, source: str) -> Any:
    """Calibrate with a progress bar on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from logtoku_guard.calibration import calibrate as run

    with Progress(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err) as bar:
        task = bar.add_task("calibrate", total=len(questions))
        return run(
            backend,
            questions,
            DecodingOptions(max_new_tokens=max_new_tokens),
            batch_size=batch_size,
            source=source,
            on_batch=lambda k: bar.advance(task, k),
        )


def _default_store(cache_dir: Path | None) -> Path:
    from logtoku_guard.embedded import cache_root

    return cache_root(cache_dir) / "audit.db"


StoreOpt = Annotated[
    str | None,
    typer.Option("--store", help="Audit store: a SQLite file path or a database URL (default: audit.db in the cache)."),
]


def _open_store(store: str | None, cache_dir: Path | None = None) -> Any:
    from logtoku_guard.audit import AuditStore

    target = store or _default_store(cache_dir)
    if store is None:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    return AuditStore(target)


@app.command()
def ask(
    prompt: Annotated[str, typer.Argument(help="The question to answer.")],
    policy: Annotated[
        Path | None, typer.Option(help="Policy file (YAML or JSON). Default: the calibrated default policy.")
    ] = None,
    profile: Annotated[Path | None, typer.Option(help="Model profile JSON (default: the saved profile of --model).")] = None,
    context_file: Annotated[
        Path | None, typer.Option(help="Passages (blank-line separated) for the retrieve action, ranked by BM25.")
    ] = None,
    store: StoreOpt = None,
    model: ModelOpt = EMBEDDED_MODEL,
    top_k: TopKOpt = DEFAULT_K,
    max_new_tokens: Annotated[int, typer.Option(help="Maximum number of generated tokens.")] = 128,
    system: Annotated[str | None, typer.Option(help="System message.")] = None,
    calibration_size: Annotated[int, typer.Option(help="Questions used when no profile exists yet and one is made.")] = 200,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    cache_dir: CacheOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Answer PROMPT through the guard: pass, warn, retrieve, abstain or send to human review."""
    from logtoku_guard.calibration import default_calibration_prompts, profile_path
    from logtoku_guard.guard import Guard, GuardRejectedError
    from logtoku_guard.policy import Policy, default_policy
    from logtoku_guard.retrieval import KeywordRetriever

    try:
        to_messages(prompt, system)
        validate_k(top_k)
        rules = Policy.from_file(policy) if policy else default_policy()
        retriever = KeywordRetriever.from_file(context_file) if context_file else None
        audit = _open_store(store, cache_dir)
        explicit = _read_profile(profile, model, top_k, "clamped") if profile else None
        backend = load_backend(model, top_k, device, dtype, cache_dir)
        prof, _ = _profile_for(backend, explicit, profile, cache_dir)
        if prof is None and (rules.uses_quantiles() or rules.rules):
            err.print(
                f"No profile for {backend.model_name} yet: calibrating once on {calibration_size} questions "
                f"(saved to {profile_path(backend.model_name, backend.k, backend.evidence, cache_dir)})."
            )
            prof = run_calibration(backend, default_calibration_prompts(calibration_size), 64, 8, f"default ({calibration_size})")
            prof.save(profile_path(backend.model_name, backend.k, backend.evidence, cache_dir))
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
        raise _fail(exc) from exc
    percentile = reliability_percentile(guard.profile, result.generation)
    if as_json:
        data = result.to_dict(guard.quadrants)
        data["reliability_percentile"] = percentile
        print_json(data)
        return
    thresholds = guard.quadrants or _thresholds(result.generation, None, None)
    render_generation(result.generation, thresholds, percentile)
    style = {"pass": "green", "warn": "yellow", "retrieve": "cyan", "abstain": "red", "human_review": "magenta", "raise": "red"}
    out.print(
        f"Action: [{style[result.action]}]{result.action}[/] (rule: {result.decision.rule or '-'}; {result.decision.reason}); "
        f"attempts: {len(result.attempts)}; trace: {result.trace_id}"
        + (f"; review id: {result.review_id}" if result.review_id is not None else ""),
        highlight=False,
    )
    out.print(Text("Returned: ", style="bold") + Text(result.answer))


review_app = typer.Typer(help="The human-review queue: list, show, claim, approve, reject.", no_args_is_help=True)
audit_app = typer.Typer(help="The audit trail of guard decisions: tail, export, purge.", no_args_is_help=True)
app.add_typer(review_app, name="review")
app.add_typer(audit_app, name="audit")


def _register_eval() -> None:
    """``logtoku-guard eval ...`` (benchmarks); its module imports only typer and rich at start."""
    from logtoku_guard.evaluation.cli import eval_app

    app.add_typer(eval_app, name="eval")


_register_eval()
ReviewerOpt = Annotated[str, typer.Option("--reviewer", "-r", help="Who decides (recorded with the verdict).")]


def _review_call(store: str | None, fn: str, *args: Any, **kwargs: Any) -> Any:
    try:
        with _open_store(store) as audit:
            return getattr(audit, fn)(*args, **kwargs)
    except LogTokUError as exc:
        raise _fail(exc) from exc


def _item_row(item: Any) -> dict[str, Any]:
    return {
        "id": item.id,
        "status": item.status,
        "trace_id": item.trace_id,
        "created_at": item.created_at.isoformat(),
        "prompt": item.record.prompt,
        "answer": item.record.answer,
        "reason": item.record.reason,
        "reviewer": item.reviewer,
        "claimed_by": item.claimed_by,
        "edited_answer": item.edited_answer,
        "note": item.note,
    }


@review_app.command("list")
def review_list(store: StoreOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Items waiting for a verdict (pending or claimed), oldest first."""
    items = _review_call(store, "pending", include_claimed=True)
    if as_json:
        print_json({"items": [_item_row(i) for i in items]})
        return
    table = Table(title=f"{len(items)} item(s) waiting for review")
    for col in ("id", "status", "created", "question", "reason"):
        table.add_column(col)
    for i in items:
        table.add_row(str(i.id), i.status, i.created_at.strftime("%Y-%m-%d %H:%M"), i.record.prompt[:60], i.record.reason[:60])
    out.print(table)


@review_app.command("show")
def review_show(item_id: Annotated[int, typer.Argument(help="Review item id.")], store: StoreOpt = None) -> None:
    """One item: the question, the answer with tokens marked by quadrant, the decision."""
    item = _review_call(store, "review_item", item_id)
    out.print(f"[bold]Review {item.id}[/] ({item.status}) trace {item.trace_id}")
    out.print(Text("Question: ", style="bold") + Text(item.record.prompt))
    answer = Text()
    for tok in item.record.tokens:
        q = tok.get("quadrant")
        answer.append(tok["token"], style=QUADRANT_STYLE[Quadrant(q)] if q else "")
    out.print(Text("Answer:   ", style="bold") + answer)
    out.print(f"Action: {item.record.action}; rule: {item.record.rule}; reason: {item.record.reason}", highlight=False)
    if item.status in ("approved", "rejected"):
        out.print(f"Verdict: {item.status} by {item.reviewer}; note: {item.note}; edited answer: {item.edited_answer}")


@review_app.command("claim")
def review_claim(item_id: Annotated[int, typer.Argument()], reviewer: ReviewerOpt, store: StoreOpt = None) -> None:
    """Claim an item so nobody else decides it."""
    item = _review_call(store, "claim", item_id, reviewer)
    out.print(f"review {item.id} claimed by {item.claimed_by}")


@review_app.command("approve")
def review_approve(
    item_id: Annotated[int, typer.Argument()],
    reviewer: ReviewerOpt,
    answer: Annotated[str | None, typer.Option(help="An edited answer to release instead.")] = None,
    note: Annotated[str | None, typer.Option(help="A note kept with the verdict.")] = None,
    store: StoreOpt = None,
) -> None:
    """Approve an item (optionally with an edited answer)."""
    item = _review_call(store, "approve", item_id, reviewer, edited_answer=answer, note=note)
    out.print(f"review {item.id} approved by {item.reviewer}")


@review_app.command("reject")
def review_reject(
    item_id: Annotated[int, typer.Argument()],
    reviewer: ReviewerOpt,
    note: Annotated[str, typer.Option(help="Why it is rejected (required).")],
    store: StoreOpt = None,
) -> None:
    """Reject an item with a note."""
    item = _review_call(store, "reject", item_id, reviewer, note)
    out.print(f"review {item.id} rejected by {item.reviewer}")


@audit_app.command("tail")
def audit_tail(
    n: Annotated[int, typer.Option("-n", help="Number of records.")] = 20,
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The newest decisions."""
    records = _review_call(store, "tail", n)
    if as_json:
        print_json(
            {
                "records": [
                    {
                        "trace_id": r.trace_id,
                        "created_at": r.created_at.isoformat(),
                        "action": r.action,
                        "rule": r.rule,
                        "reliability": r.reliability,
                        "prompt": r.prompt,
                        "answer": r.answer,
                        "reason": r.reason,
                    }
                    for r in records
                ]
            }
        )
        return
    table = Table(title=f"last {len(records)} decision(s)")
    for col in ("time", "action", "rule", "reliability", "question"):
        table.add_column(col)
    for r in records:
        rel = "n/a" if r.reliability is None else f"{r.reliability:.4f}"
        table.add_row(r.created_at.strftime("%Y-%m-%d %H:%M:%S"), r.action, r.rule or "-", rel, r.prompt[:60])
    out.print(table)


@audit_app.command("export")
def audit_export(
    path: Annotated[Path, typer.Argument(help="Output file.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv.")] = "jsonl",
    store: StoreOpt = None,
) -> None:
    """Export every record as JSONL or CSV."""
    n = _review_call(store, "export", path, fmt)
    out.print(f"{n} record(s) written to {path}")


@audit_app.command("purge")
def audit_purge(
    days: Annotated[float, typer.Option(help="Drop records older than this many days.")],
    store: StoreOpt = None,
) -> None:
    """Retention: drop records (and their review items) older than DAYS."""
    n = _review_call(store, "purge_older_than", days)
    out.print(f"{n} record(s) older than {days:g} day(s) removed")


def print_json(data: dict[str, Any]) -> None:
    """One JSON object on stdout (strict JSON: NaN already mapped to null)."""
    typer.echo(json.dumps(data, ensure_ascii=False, allow_nan=False))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
