"""Tests of ``logtoku_eval``, one module per package module, beside the harness they test (a
package, so that ``evaluation/tests/test_cli.py`` and the core's ``tests/cli/test_cli.py`` do not
clash). The README's test command runs them with the core's (``testpaths`` in pyproject.toml)."""
