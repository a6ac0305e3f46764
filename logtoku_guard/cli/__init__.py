"""The ``logtoku-guard`` command line (typer + rich): one module per command group.

``_common`` (consoles, shared options, errors, model and profile loading, rendering),
``score``, ``guard`` (``calibrate``, ``ask``), ``review`` and ``audit``; ``serve`` comes from
:mod:`logtoku_guard.cli.serve`; ``eval`` (benchmarks) from the evaluation harness, a
separate distribution found through an entry point (:mod:`~logtoku_guard.cli.plugins`), built on
the public helpers of :mod:`~logtoku_guard.cli.toolkit`.
This package only assembles them into :data:`app`; the console script is ``logtoku_guard.cli:main``.
Each command's module is imported only when that command is looked up (:class:`LazyGroup`: run,
or listed by ``--help``), and heavy dependencies (torch, transformers, SQLAlchemy) inside the
commands, so a one-off ``logtoku-guard ask`` loads neither the other commands nor their imports.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, cast

import typer
import typer.main
from typer.core import TyperGroup
from typer.models import CommandInfo, TyperInfo

from logtoku_guard.cli._common import err, load_backend, out, print_json, reliability_percentile, render_generation
from logtoku_guard.cli.plugins import add_plugins

if TYPE_CHECKING:
    from typer import _click

    from logtoku_guard.cli.guard_commands import run_calibration

__all__ = [
    "COMMANDS",
    "GROUPS",
    "LazyGroup",
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

COMMANDS: dict[str, tuple[str, str]] = {
    "score": ("logtoku_guard.cli.score", "score"),
    "calibrate": ("logtoku_guard.cli.guard_commands", "calibrate"),
    "ask": ("logtoku_guard.cli.guard_commands", "ask"),
    "serve": ("logtoku_guard.cli.serve", "serve"),
}
"""The core commands, ``{name: (module, command function)}``, in the order ``--help`` lists them."""
GROUPS: dict[str, tuple[str, str]] = {
    "review": ("logtoku_guard.cli.review_commands", "review_app"),
    "audit": ("logtoku_guard.cli.audit", "audit_app"),
}
"""The core command groups, ``{name: (module, typer.Typer)}``, listed after the commands (as typer lists them)."""


class _Commands(MutableMapping[str, "_click.Command"]):
    """A group's commands by name, the lazy ones made on first lookup (``loaders``); iterating gives
    the names in ``order`` without making any."""

    def __init__(self, made: dict[str, _click.Command], loaders: dict[str, Callable[[], _click.Command]], order: list[str]):
        self._made = made
        self._loaders = loaders
        self._order = order

    def reorder(self, order: list[str]) -> None:
        """List the names in ``order``, then any others as they were."""
        self._order = [*order, *(name for name in self._order if name not in order)]

    def made(self) -> dict[str, _click.Command]:
        """The commands built so far."""
        return dict(self._made)

    def __getitem__(self, name: str) -> _click.Command:
        if name not in self._made:
            if name not in self._loaders:
                raise KeyError(name)
            self._made[name] = self._loaders[name]()
        return self._made[name]

    def __setitem__(self, name: str, command: _click.Command) -> None:
        if name not in self._order:
            self._order.append(name)
        self._made[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._order:
            raise KeyError(name)
        self._order.remove(name)
        self._made.pop(name, None)
        self._loaders.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._order

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)


class LazyGroup(TyperGroup):
    """The root command group: the commands of :data:`COMMANDS` and :data:`GROUPS` are imported and
    built by typer only when looked up (the one run, or all of them for ``--help``); the command
    groups of other distributions (:func:`~logtoku_guard.cli.plugins.add_plugins`) are found and
    loaded only when a name that is not a core command is looked up, or ``--help`` lists them.
    Names, order, help and behaviour are those of the same commands registered eagerly."""

    lazy_commands: ClassVar[Mapping[str, tuple[str, str]]] = COMMANDS
    lazy_groups: ClassVar[Mapping[str, tuple[str, str]]] = GROUPS
    plugins: ClassVar[tuple[Callable[[typer.Typer], None], ...]] = ()
    """What adds the plugins' commands to a scratch Typer when first needed (:meth:`with_plugins`)."""

    def __init__(self, *, commands: Any = None, **attrs: Any) -> None:
        made: dict[str, _click.Command] = dict(commands or {})
        lazy = {**self.lazy_commands, **self.lazy_groups}
        loaders = {name: _loader(name, *where) for name, where in lazy.items() if name not in made}
        self._plugins_pending = bool(self.plugins)
        super().__init__(commands=cast(dict[str, Any], _Commands(made, loaders, [])), **attrs)  # typer keeps the mapping
        self._order(made)

    @classmethod
    def with_plugins(cls, add: Callable[[typer.Typer], None]) -> type[LazyGroup]:
        """This group class, its plugins added by ``add`` (onto a scratch Typer) when first needed."""
        return type(cls.__name__, (cls,), {"plugins": (add,)})

    def _order(self, made: Mapping[str, _click.Command]) -> None:
        """typer lists registered commands, then groups: a plugin's stand-in command before the core groups."""
        commands = cast(_Commands, self.commands)
        commands.reorder(
            [
                *(name for name in self.lazy_commands if name not in made),
                *(name for name, c in made.items() if not hasattr(c, "list_commands")),
                *(name for name in self.lazy_groups if name not in made),
                *(name for name, c in made.items() if hasattr(c, "list_commands")),
            ]
        )

    def _add_plugins(self) -> None:
        if not self._plugins_pending:
            return
        self._plugins_pending = False
        scratch = typer.Typer()
        for add in self.plugins:
            add(scratch)
        made = {name: c for name, c in cast(_Commands, self.commands).made().items() if name not in self.lazy_commands}
        for info in scratch.registered_commands:
            command = typer.main.get_command_from_info(
                info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode
            )
            made[command.name or ""] = command
        for group_info in scratch.registered_groups:
            group = _group(group_info)
            made[group.name or ""] = group
        for name, command in made.items():
            self.commands[name] = command
        self._order({name: c for name, c in made.items() if name not in self.lazy_groups})

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name not in self.commands:
            self._add_plugins()
        return self.commands.get(cmd_name)

    def list_commands(self, ctx: _click.Context) -> list[str]:
        self._add_plugins()
        return list(self.commands)


def _loader(name: str, module: str, attr: str) -> Callable[[], _click.Command]:
    """Import ``module``, build its ``attr`` as typer builds a command registered on :data:`app`."""

    def load() -> _click.Command:
        target = getattr(importlib.import_module(module), attr)
        if isinstance(target, typer.Typer):
            return _group(TyperInfo(target, name=name))
        scratch = typer.Typer()
        scratch.command(name)(target)
        info: CommandInfo = scratch.registered_commands[0]
        return typer.main.get_command_from_info(
            info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode
        )

    return load


def _group(info: TyperInfo) -> _click.Command:
    """A command group added to :data:`app` (``info``: as ``add_typer`` records it), built as typer builds it."""
    return typer.main.get_group_from_info(
        info,
        pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode,
        suggest_commands=app.suggest_commands,
    )


app = typer.Typer(
    help="LogTokU: per-token aleatoric (AU) and epistemic (EU) uncertainty of a local LLM, in one pass.",
    no_args_is_help=True,
    add_completion=False,
    cls=LazyGroup,
)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the library does (to stderr).")] = False,
) -> None:
    """LogTokU: per-token aleatoric (AU) and epistemic (EU) uncertainty of a local LLM, in one pass."""
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def __getattr__(name: str) -> Any:
    if name == "run_calibration":  # re-exported; its module is imported with the command that needs it
        from logtoku_guard.cli.guard_commands import run_calibration

        return run_calibration
    msg = f"module 'logtoku_guard.cli' has no attribute {name!r}"
    raise AttributeError(msg)


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
