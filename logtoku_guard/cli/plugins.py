"""Command groups that other distributions add to ``logtoku-guard`` through an entry point.

A distribution registers a :class:`typer.Typer` under the entry-point group :data:`GROUP`
(``logtoku_guard.cli``); its name is the subcommand. Such a group builds its options, errors
and model loading from :mod:`logtoku_guard.cli.toolkit`, the CLI's public helpers. The
evaluation harness (``logtoku-guard-eval``, import root ``logtoku_eval``) registers ``eval``
this way, so the core package never imports it::

    [project.entry-points."logtoku_guard.cli"]
    eval = "logtoku_eval.cli:eval_app"

Where a known group is not installed, or any group fails to load (an error at import, a missing
attribute, an object that is not a Typer), its name still answers: with exit
status 2 and a message saying how to install it (:func:`missing_command`), never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points

import typer

from logtoku_guard.cli import _common
from logtoku_guard.errors import ConfigurationError

__all__ = ["EVAL_INSTALL", "GROUP", "KNOWN", "add_plugins", "missing_command"]

GROUP = "logtoku_guard.cli"
"""The entry-point group of ``logtoku-guard`` command groups."""

EVAL_INSTALL = (
    "the evaluation harness is a separate distribution, logtoku-guard-eval; install it from a checkout with "
    "`pip install ./evaluation` (or `bash scripts/install.sh --eval`)"
)
KNOWN = {
    "eval": (
        "Benchmarks: TruthfulQA, NQ-open, GoEmotions, known vs fabricated, realistic traffic, the guard end to end "
        "(the logtoku-guard-eval harness).",
        EVAL_INSTALL,
    )
}
"""Command groups documented with the core: ``{name: (help, how to install it)}``."""

log = logging.getLogger(__name__)


def missing_command(app: typer.Typer, name: str, reason: str, help_text: str | None = None) -> None:
    """Add a stand-in command ``name`` to ``app``: any use of it (``--help`` and any arguments
    included) exits 2 with ``reason``."""

    def stand_in() -> None:
        raise _common.fail(ConfigurationError(f"`logtoku-guard {name}`: {reason}"))

    app.command(
        name,
        help=help_text,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(stand_in)


def add_plugins(app: typer.Typer, found: Iterable[EntryPoint] | None = None) -> None:
    """Add each group registered under :data:`GROUP` (``found``: the installed ones by default),
    then a :func:`missing_command` stand-in for every :data:`KNOWN` group that is not there.

    On an app whose group class is a :class:`~logtoku_guard.cli.LazyGroup` (the core CLI's), they
    are found and added when first needed (a name that is not a core command is looked up, or
    ``--help`` lists the commands): a core command runs without reading the entry points."""
    taken: set[str | None] = {info.name for info in app.registered_groups} | {
        info.name or (info.callback.__name__.lower().replace("_", "-") if info.callback else None)  # typer's default name
        for info in app.registered_commands
    }
    for lazy in ("lazy_commands", "lazy_groups"):  # the core commands a LazyGroup imports when looked up
        taken |= set(getattr(app.info.cls, lazy, ()))
    with_plugins = getattr(app.info.cls, "with_plugins", None)
    if with_plugins is not None:
        app.info.cls = with_plugins(lambda scratch: _add(scratch, found, taken))
        return
    _add(app, found, taken)


def _add(app: typer.Typer, found: Iterable[EntryPoint] | None, taken: set[str | None]) -> None:
    added: set[str] = set()
    for ep in entry_points(group=GROUP) if found is None else found:
        if ep.name in taken or ep.name in added:
            log.warning("ignored the %s entry point %r (%s): that command already exists", GROUP, ep.name, ep.value)
            continue
        help_text, install = KNOWN.get(ep.name, (None, "reinstall the distribution that provides it"))
        added.add(ep.name)
        try:
            group = ep.load()
        except Exception as exc:  # a broken plugin (import error, missing attribute, error at import) must not break the core CLI
            # Reported when the command is used (and logged now); the rest of the CLI keeps working.
            log.warning("the %s entry point %r (%s) failed to load: %r", GROUP, ep.name, ep.value, exc)
            reason = f"{ep.value} failed to import ({type(exc).__name__}: {exc}); {install}"
            missing_command(app, ep.name, reason, help_text)
            continue
        if not isinstance(group, typer.Typer):
            reason = f"{ep.value} is a {type(group).__name__}, not a typer.Typer command group; {install}"
            missing_command(app, ep.name, reason, help_text)
            continue
        app.add_typer(group, name=ep.name, help=help_text)
    for name, (help_text, install) in KNOWN.items():
        if name not in added:
            missing_command(app, name, f"not installed: {install}", help_text)
