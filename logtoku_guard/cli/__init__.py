"""The ``logtoku-guard`` command line (typer + rich): one module per command group.

``_common`` (consoles, shared options, errors, model and profile loading, rendering),
``score``, ``guard`` (``calibrate``, ``ask``), ``review`` and ``audit``; ``serve`` comes from
:mod:`logtoku_guard.cli.serve`; ``eval`` (benchmarks) from the evaluation harness, a
separate distribution found through an entry point (:mod:`~logtoku_guard.cli.plugins`), built on
the public helpers of :mod:`~logtoku_guard.cli.toolkit`.
This package only assembles them into :data:`app`; the console script is ``logtoku_guard.cli:main``.
Heavy dependencies (torch, transformers, SQLAlchemy) are imported inside the commands,
so ``logtoku-guard --help`` starts fast.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from logtoku_guard.cli import audit, guard_commands, review_commands, score
from logtoku_guard.cli._common import err, load_backend, out, print_json, reliability_percentile, render_generation
from logtoku_guard.cli.guard_commands import run_calibration
from logtoku_guard.cli.plugins import add_plugins
from logtoku_guard.cli.review_serve import add_reviewer
from logtoku_guard.cli.review_serve import serve as review_serve
from logtoku_guard.cli.serve import serve as serve_command

__all__ = [
    "app",
    "err",
    "load_backend",
    "main",
    "out",
    "print_json",
    "reliability_percentile",
    "render_generation",
    "run_calibration",
]

app = typer.Typer(
    help="LogTokU: per-token aleatoric (AU) and epistemic (EU) uncertainty of a local LLM, in one pass.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the library does (to stderr).")] = False,
) -> None:
    """LogTokU: per-token aleatoric (AU) and epistemic (EU) uncertainty of a local LLM, in one pass."""
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


app.command()(score.score)
app.command()(guard_commands.calibrate)
app.command()(guard_commands.ask)
app.command("serve")(serve_command)
review_commands.review_app.command("serve")(review_serve)
review_commands.review_app.command("add-reviewer")(add_reviewer)
app.add_typer(review_commands.review_app, name="review")
app.add_typer(audit.audit_app, name="audit")


def main() -> None:
    """The ``logtoku-guard`` console script: the core commands plus the command groups other
    distributions register (:mod:`logtoku_guard.cli.plugins`). The groups are added here, not
    when this package is imported: a plugin imports this package for its shared options, and
    importing the plugin first must not load it again half-initialised."""
    bad = undecodable_argument(sys.argv[1:])
    if bad is not None:
        err.print(bad, markup=False, highlight=False)
        raise SystemExit(2)
    add_plugins(app)
    app()


def undecodable_argument(argv: list[str]) -> str | None:
    """An error naming the first argument that is not valid UTF-8 (Python keeps its bytes as lone
    surrogates, which every later write of it would fail on), or None."""
    for i, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            shown = arg.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
            raw = arg[exc.start : exc.start + 1].encode("utf-8", "surrogateescape")
            return (
                f"error: argument {i} ({shown[:80]!r}) is not valid UTF-8 (byte {raw!r} at character {exc.start}); "
                "pass it as UTF-8 text"
            )
    return None
