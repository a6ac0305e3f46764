"""The ``logtoku-guard serve`` command (a typer function; the CLI registers it).

logtoku-guard serve [--host 127.0.0.1] [--port 8000] [--model ...] [--api-key ...]
                    [--max-batch 8] [--threads N] [--prefix-cache-mb 64] [--policy policy.yaml]
                    [--store audit.db] [--logprobs-mode raw_logprobs|raw_logits] [--max-tokens 1024] ...
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from logtoku_guard.backends.base import Backend
from logtoku_guard.backends.chunked_prefill import DEFAULT_PREFILL_CHUNK, MIN_PREFILL_CHUNK
from logtoku_guard.backends.prefix_cache import DEFAULT_PREFIX_CACHE_MB
from logtoku_guard.scoring.uncertainty import DEFAULT_K, DEFAULT_TOP_N
from logtoku_guard.types import GREEDY_BELOW

if TYPE_CHECKING:
    from logtoku_guard.calibration.profiles import ModelProfile
    from logtoku_guard.server.limits import Limits


def serve(
    host: Annotated[str, typer.Option(help="Address to bind; a non-loopback one needs --allow-remote.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: any free port, printed at start).")] = 8000,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Model: the embedded default, a folder or .gguf, a hub id, gemma3-270m (llamacpp)."),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="LOGTOKU_GUARD_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1 routes."),
    ] = None,
    allow_remote: Annotated[bool, typer.Option(help="Allow binding to a non-loopback address.")] = False,
    max_batch: Annotated[
        int, typer.Option(help="Most concurrent requests in the running batch (continuous batching; 1: one at a time).")
    ] = 8,
    threads: Annotated[
        int | None,
        typer.Option(
            envvar="LOGTOKU_GUARD_THREADS",
            help="torch CPU threads for generation (default: 1 on <= 2 CPUs, else half the CPUs up to 8; 0: torch's).",
        ),
    ] = None,
    prefix_cache_mb: Annotated[
        int,
        typer.Option(help="MiB of prompt-prefix KV caches kept (chat template + system prompt prefilled once; 0: off)."),
    ] = DEFAULT_PREFIX_CACHE_MB,
    prefill_chunk: Annotated[
        int,
        typer.Option(
            help="Prompt tokens a longer prompt is fed at a time (fewer deeper in it), by a thread of its own beside "
            f"the decoding requests, so it cannot stall them (>= {MIN_PREFILL_CHUNK}; 0: prefill every prompt whole)."
        ),
    ] = DEFAULT_PREFILL_CHUNK,
    policy: Annotated[
        Path | None, typer.Option(help="Guard every answer with this policy: a YAML or JSON file, or a shipped name (cascade).")
    ] = None,
    profile: Annotated[Path | None, typer.Option(help="Model profile JSON, for a policy with quantile thresholds.")] = None,
    top_k: Annotated[
        int, typer.Option("--top-k", "-k", help="Raw logits kept per token (K of AU/EU; max top_logprobs).")
    ] = DEFAULT_K,
    top_n: Annotated[int, typer.Option(help="Least reliable tokens averaged into the response reliability.")] = DEFAULT_TOP_N,
    max_tokens: Annotated[int, typer.Option(help="Largest max_tokens a request may ask for.")] = 1024,
    default_max_tokens: Annotated[
        int | None,
        typer.Option(
            help="max_tokens of a request that sends none, chat or /v1/completions (default: the answer length "
            "the guard was calibrated on: the profile's, else ask's 64; at most --max-tokens). OpenAI's: 256 "
            "with --default-temperature 1.",
        ),
    ] = None,
    default_temperature: Annotated[
        float | None,
        typer.Option(
            help="temperature of a request that sends none (default: 0, greedy, as ask answers and the guard was "
            "calibrated; sampled answers score far below its threshold). 1: OpenAI's default.",
        ),
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body, in bytes.")] = 1_000_000,
    served_name: Annotated[str | None, typer.Option(help="Model name clients send (default: the model's name).")] = None,
    device: Annotated[str, typer.Option(help="Device: auto, cpu, cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="Weights dtype: auto, float32, bfloat16, float16.")] = "auto",
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder of the embedded model.")] = None,
    graceful_timeout: Annotated[float, typer.Option(help="Seconds to let requests in flight finish on shutdown.")] = 30.0,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="Open connections at most (default: the open-file limit, ulimit -n, less 128). A connection over it "
            "closes the oldest one still sending its request head, else gets a 503.",
        ),
    ] = None,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a request's head (request line and headers).")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a request's body once its head is in.")
    ] = 30.0,
    backend_name: Annotated[
        str,
        typer.Option(
            "--backend",
            help="Inference backend: transformers (default), llamacpp (a .gguf model run by llama.cpp; "
            "pip install 'logtoku-guard\\[llamacpp]'; --threads sets its threads, --prefix-cache-mb does not apply) "
            "or openai (guard a remote OpenAI-compatible server that sends raw top-K logits: --base-url; key from "
            "LOGTOKU_GUARD_REMOTE_API_KEY or OPENAI_API_KEY).",
        ),
    ] = "transformers",
    base_url: Annotated[
        str | None,
        typer.Option(help="With --backend openai: the remote server's address, e.g. http://127.0.0.1:8001/v1."),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="Audit store of every guarded answer (a SQLite file or a postgresql:// URL): needed by a policy's "
            "human_review; reviewers decide with 'logtoku-guard review serve --store' on the same store.",
        ),
    ] = None,
    logprobs_mode: Annotated[
        str,
        typer.Option(
            help="What 'logprob' holds: raw_logprobs (OpenAI's log-probabilities, the default) or raw_logits "
            "(vLLM's opt-in, for clients that read raw logits there). The logtoku extension has the raw logits either way.",
        ),
    ] = "raw_logprobs",
    metrics: Annotated[
        str,
        typer.Option(help="GET /metrics (Prometheus): auth (behind --api-key like /v1, the default), open (no key), or off."),
    ] = "auth",
) -> None:
    """Serve the model over an OpenAI-compatible API (log-probabilities, plus LogTokU scores and guard decisions)."""
    from logtoku_guard.errors import ConfigurationError
    from logtoku_guard.server.connections import ConnectionLimits
    from logtoku_guard.server.limits import Limits
    from logtoku_guard.server.settings import ServerSettings, require_serve_extra
    from logtoku_guard.sockets import bind_socket

    sock = None
    audit: Any = None
    try:
        require_serve_extra()
        from logtoku_guard.cli._common import check_backend

        check_backend(backend_name, device, dtype, base_url)
        if api_key is None and os.environ.get("LOGTOKU_GUARD_API_KEY") == "":  # click reads an empty variable as unset
            msg = (
                "LOGTOKU_GUARD_API_KEY is set but empty: the server would accept any request; set it to a real key "
                "(python -c 'import secrets; print(secrets.token_urlsafe(32))'), or unset it to serve without one"
            )
            raise ConfigurationError(msg)
        from logtoku_guard.backends.registry import BackendSettings, create_backend

        # --max-batch, --prefix-cache-mb and --prefill-chunk: checked by BackendSettings, here, before the model loads
        batching = BackendSettings(max_batch=max_batch, prefix_cache_mb=prefix_cache_mb, prefill_chunk=prefill_chunk)
        pol = prof = None
        if policy is not None:
            from logtoku_guard.decision.policy import Policy

            pol = Policy.load(policy)
        if profile is not None:
            from logtoku_guard.backends.embedded import EMBEDDED_MODEL
            from logtoku_guard.cli._common import read_profile

            prof = read_profile(profile, model or EMBEDDED_MODEL, top_k, "clamped")  # never echoes the file's content
        mode: Any = logprobs_mode  # checked by Limits
        settings = ServerSettings(  # every server setting checked here, once, before the model loads
            host=host,
            port=port,
            allow_remote=allow_remote,
            graceful_timeout=graceful_timeout,
            connections=ConnectionLimits(max_connections, header_timeout, body_timeout),
            api_key=api_key,
            max_body_bytes=max_body_bytes,
            limits=Limits(
                max_tokens=max_tokens,
                default_max_tokens=default_max_tokens,  # None: the calibrated length, or --max-tokens if lower
                logprobs_mode=mode,
                default_temperature=0.0 if default_temperature is None else default_temperature,
            ),
            model_names=(served_name,) if served_name else (),
            metrics=metrics,
            policy=pol,
            profile=prof if prof is not None or pol is None or not pol.uses_quantiles() else "auto",
            store=store,
            cache_dir=cache_dir,
        )
        sock = bind_socket(host, port)  # before the model loads: a port in use fails at once
        if store is not None:
            from logtoku_guard.cli._common import open_store

            audit = open_store(store, cache_dir)
            settings = settings.model_copy(update={"store": audit})  # the store the settings named, opened
        local = backend_name != "openai"
        backend_settings = replace(
            batching,
            model=model,  # None: the embedded model here, the one the server serves with --backend openai
            k=top_k,
            top_n=top_n,
            device=device if backend_name == "transformers" else None,
            dtype=dtype if backend_name == "transformers" else None,
            cache_dir=cache_dir if backend_name == "transformers" else None,
            max_batch=max_batch if local else None,
            threads=threads if backend_name == "transformers" else (threads or None),
            prefix_cache_mb=prefix_cache_mb if backend_name == "transformers" else None,
            prefill_chunk=prefill_chunk if local else None,
            base_url=base_url,
        )
        backend: Backend = create_backend(backend_name, backend_settings)
        from logtoku_guard.server.app import create_app

        app = create_app(settings, backend)  # the guard, built once: a policy it cannot apply fails here, before serving
    except Exception as exc:
        if sock is not None:
            sock.close()
        if audit is not None:
            audit.close()
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    from logtoku_guard.server.run import serve_app, url

    serving = app.state.serving
    served_profile = serving.engine.profile or prof  # the profile state.py read the omitted length from
    typer.echo(
        f"serving {backend.model_name!r} on {url(host, sock.getsockname()[1])} "
        f"(K={backend.k}, max batch {getattr(backend, 'max_batch', max_batch)}); "
        + defaults_line(serving.limits, default_temperature is not None, served_profile),
        err=True,
    )
    try:
        serve_app(app, settings, sock)
    finally:
        sock.close()


def defaults_line(limits: Limits, temperature_given: bool, profile: ModelProfile | None) -> str:
    """What a request that sends no ``temperature`` or ``max_tokens`` gets, and why (the startup line's end).

    ``limits``: the served :class:`~logtoku_guard.server.limits.Limits`; ``temperature_given``: whether
    ``--default-temperature`` was passed; ``profile``: the guard's profile (None: no guard, or none loaded)."""
    t = limits.default_temperature
    temperature = f"temperature {t:g}" + (" (greedy)" if t < GREEDY_BELOW else " (sampled)")
    temperature += " from --default-temperature" if temperature_given else ", as ask answers and the guard was calibrated"
    n = limits.omitted_max_tokens
    if limits.default_max_tokens is not None:
        length = f"up to {n} tokens from --default-max-tokens"
    else:
        fitted = limits.calibrated_max_tokens
        recorded = getattr(getattr(profile, "guard", None), "max_tokens", None) is not None
        whose = "the profile's guard was fitted on" if recorded else "ask answers with"
        length = f"up to {n} tokens, the length {whose}" if n == fitted else f"up to {n} tokens (--max-tokens; {whose} {fitted})"
    line = f"a request that sends no temperature or max_tokens gets {temperature} and {length}"
    if temperature_given and limits.default_max_tokens is not None:
        return line
    return line + "; --default-temperature 1 --default-max-tokens 256 for OpenAI's defaults"
