"""``logtoku-guard eval ...``: the harness's command group.

The core CLI finds :data:`eval_app` through the entry point ``eval`` of the group
``logtoku_guard.cli`` (this distribution's ``pyproject.toml``), so ``logtoku_guard`` never
imports the harness. :mod:`~logtoku_eval.cli.paper` holds the sub-app, the shared options and
the paper's protocols (``truthfulqa``, ``nq-open``, ``dynamic-decoding``);
:mod:`~logtoku_eval.cli.guard` adds the guard's own benchmarks (``guard``, ``fabricated``,
``traffic``); :mod:`~logtoku_eval.cli.ordinary` adds ``ordinary``.
"""

from __future__ import annotations

from logtoku_eval.cli import (
    guard,  # noqa: F401 - registers eval guard | fabricated | traffic
    ordinary,  # noqa: F401 - registers eval ordinary
)
from logtoku_eval.cli.paper import eval_app

__all__ = ["eval_app"]
