"""The ``logtoku-guard`` command line (typer + rich).

typer gives typed options and ``--help`` from the signatures; rich gives the coloured
tokens, tables and the spinner while a model loads or converts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from logtoku_guard.embedded import EMBEDDED_MODEL
from logtoku_guard.errors import LogTokUError
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


def _thresholds(generation: Generation, au: float | None, eu: float | None) -> QuadrantThresholds:
    if au is not None and eu is not None:
        return QuadrantThresholds(au, eu, source="command line")
    if (au is None) != (eu is None):
        msg = "give both --au-threshold and --eu-threshold, or neither"
        raise typer.BadParameter(msg)
    tokens = generation.tokens
    if not tokens:
        return QuadrantThresholds(0.0, 0.0, source="no tokens")
    return QuadrantThresholds.from_quantile(
        [t.au for t in tokens], [t.eu for t in tokens], 0.5, source="median of this answer (uncalibrated)"
    )


def _fmt(x: float, digits: int = 4) -> str:
    return "nan" if math.isnan(x) else f"{x:.{digits}f}"


def render_generation(generation: Generation, thresholds: QuadrantThresholds) -> None:
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
        f"Response reliability (top-{s.top_n} mean, higher = more reliable): [bold]{_fmt(s.reliability)}[/]   "
        f"plain mean: {_fmt(s.reliability_mean)}   tokens: {s.n_tokens}   finish: {generation.finish_reason}"
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
        float | None, typer.Option(help="AU threshold for quadrants (default: median of this answer).")
    ] = None,
    eu_threshold: Annotated[
        float | None, typer.Option(help="EU threshold for quadrants (default: median of this answer).")
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    cache_dir: CacheOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the coloured view.")] = False,
) -> None:
    """Answer PROMPT and show every token's AU/EU, its quadrant and the response reliability."""
    try:
        to_messages(prompt, system)  # fail on a bad prompt before spending seconds on loading
        validate_k(top_k)
        options = DecodingOptions(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=tuple(stop or ()),
            dynamic=DynamicTemperature(t_max=t_max, t_min=t_min) if dynamic else None,
        )
        backend = load_backend(model, top_k, device, dtype, cache_dir, evidence, top_n)
        generation = backend.generate(prompt, options, system=system)
    except LogTokUError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from exc
    thresholds = _thresholds(generation, au_threshold, eu_threshold)
    if as_json:
        print_json(generation.to_dict(thresholds))
    else:
        render_generation(generation, thresholds)


def print_json(data: dict[str, Any]) -> None:
    """One JSON object on stdout (strict JSON: NaN already mapped to null)."""
    typer.echo(json.dumps(data, ensure_ascii=False, allow_nan=False))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
