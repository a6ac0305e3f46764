"""``logtoku-guard score``: answer a prompt and show every token's AU/EU, quadrant and the reliability."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from logtoku_guard.backends.embedded import EMBEDDED_MODEL
from logtoku_guard.cli import _common
from logtoku_guard.cli._common import BackendOpt, CacheOpt, DeviceOpt, DtypeOpt, ModelOpt, TopKOpt
from logtoku_guard.errors import LogTokUError
from logtoku_guard.scoring.uncertainty import DEFAULT_K, DEFAULT_TOP_N, validate_k
from logtoku_guard.types import DecodingOptions, DynamicTemperature, to_messages
from logtoku_guard.wire.payloads import generation_payload


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
    backend_name: BackendOpt = "transformers",
    base_url: _common.BaseUrlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the coloured view.")] = False,
) -> None:
    """Answer PROMPT and show every token's AU/EU, its quadrant and the response reliability.

    Quadrant thresholds: --au-threshold and --eu-threshold when given, else the model's profile.

    The profile is --profile, else the one `logtoku-guard calibrate` saved; without one, the median of this answer.
    """
    given = _common.cli_thresholds(au_threshold, eu_threshold)
    try:
        to_messages(prompt, system)  # fail on a bad prompt before spending seconds on loading
        validate_k(top_k)
        _common.check_load_options(device, cache_dir)
        _common.check_backend(backend_name, device, dtype, base_url)
        _common.check_seed(seed)
        explicit = _common.read_profile(profile, model, top_k, evidence) if profile else None
        options = DecodingOptions(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=tuple(stop or ()),
            dynamic=DynamicTemperature(t_max=t_max, t_min=t_min) if dynamic else None,
        )
        backend = _common.load_backend(model, top_k, device, dtype, cache_dir, evidence, top_n, backend_name, base_url)
        if given is None or explicit:
            prof, prof_path = _common.profile_for(backend, explicit, profile, cache_dir)
        else:
            prof, prof_path = None, None
        thresholds = given or (_common.profile_thresholds(prof, prof_path) if prof is not None else None)
        generation = backend.generate(to_messages(prompt, system), options)  # the Backend protocol: messages
    except LogTokUError as exc:
        raise _common.fail(exc) from exc
    if thresholds is None:
        thresholds = _common.answer_median(generation)
    percentile = _common.reliability_percentile(prof, generation)
    if as_json:
        _common.print_json(
            {
                **generation_payload(generation, thresholds),
                "profile": str(prof_path) if prof is not None and given is None else None,
                "reliability_percentile": percentile,
            }
        )
    else:
        _common.render_generation(generation, thresholds, percentile)
