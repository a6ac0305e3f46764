"""The public toolkit for command groups that other distributions add to ``logtoku-guard``.

A plugin (a :class:`typer.Typer` registered under the entry-point group ``logtoku_guard.cli``,
see :mod:`logtoku_guard.cli.plugins`) builds its commands from these names, so its options,
errors and model loading read like the core commands'. They are the stable part of the CLI's
helpers; everything else in ``logtoku_guard.cli`` is internal.

Consoles
    :data:`out` (results, stdout) and :data:`err` (spinners, progress bars, errors, stderr).
Errors and output
    :func:`fail` (one red line on stderr; ``raise fail(exc) from exc`` exits with status 2),
    :func:`safe_text` (stored or user-given text as a Rich ``Text`` that cannot drive the
    terminal), :func:`print_json` (one strict JSON object on stdout).
Shared options (``typing.Annotated`` types for typer)
    :data:`ModelOpt`, :data:`TopKOpt`, :data:`DeviceOpt`, :data:`DtypeOpt`, :data:`CacheOpt`,
    :data:`BackendOpt` (with :data:`BACKENDS`, its choices).
Checks before any model loads (each raises :class:`~logtoku_guard.errors.ConfigurationError`)
    :func:`check_backend`, :func:`check_load_options`, :func:`check_seed` (with
    :data:`SEED_MAX`), :func:`check_at_least_one`.
Model loading
    :func:`load_backend` (a transformers or llama.cpp backend, with a spinner on stderr).

Call :func:`load_backend` through this module (``toolkit.load_backend(...)``), so a test can
replace it with ``monkeypatch.setattr(toolkit, "load_backend", ...)``.
"""

from __future__ import annotations

from logtoku_guard.cli._common import (
    BACKENDS,
    SEED_MAX,
    BackendOpt,
    CacheOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    TopKOpt,
    check_at_least_one,
    check_backend,
    check_load_options,
    check_seed,
    err,
    fail,
    load_backend,
    out,
    print_json,
    safe_text,
)

__all__ = [
    "BACKENDS",
    "SEED_MAX",
    "BackendOpt",
    "CacheOpt",
    "DeviceOpt",
    "DtypeOpt",
    "ModelOpt",
    "TopKOpt",
    "check_at_least_one",
    "check_backend",
    "check_load_options",
    "check_seed",
    "err",
    "fail",
    "load_backend",
    "out",
    "print_json",
    "safe_text",
]
