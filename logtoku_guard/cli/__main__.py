"""``python -m logtoku_guard.cli``: the same as the ``logtoku-guard`` command."""

from logtoku_guard.cli import main

main()
