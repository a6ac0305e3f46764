"""Tests of ``logtoku_eval``, one module per package module (a package, so that
``tests/evaluation/test_cli.py`` and ``tests/test_cli.py`` do not clash)."""
