"""``logtoku-guard eval ...``: the harness's command group.

The core CLI finds :data:`eval_app` through the entry point ``eval`` of the group
``logtoku_guard.cli`` (this distribution's ``pyproject.toml``), so ``logtoku_guard`` never
imports the harness. :mod:`~logtoku_eval.cli.common` holds the sub-app and the options and helpers
every command shares; :mod:`~logtoku_eval.cli.paper` adds the paper's protocols (``truthfulqa``,
``nq-open``, ``dynamic-decoding``), :mod:`~logtoku_eval.cli.guard` the guard's own benchmarks
(``guard``, ``fabricated``, ``traffic``) and :mod:`~logtoku_eval.cli.ordinary` ``ordinary``.
"""

from __future__ import annotations

# isort: off
# The order registers the commands, and --help lists them in it: the paper's first.
from logtoku_eval.cli import paper  # noqa: F401 - registers eval truthfulqa | nq-open | dynamic-decoding
from logtoku_eval.cli import guard  # noqa: F401 - registers eval guard | fabricated | traffic
from logtoku_eval.cli import ordinary  # noqa: F401 - registers eval ordinary

# isort: on
from logtoku_eval.cli.common import eval_app

__all__ = ["eval_app"]
