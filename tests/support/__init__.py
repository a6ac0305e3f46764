"""Helpers shared by the test modules (not tests themselves).

``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject.toml), so every test module, in
``tests/`` or in an integration's ``integrations/*/tests/``, and the root ``conftest.py`` import
these as ``from support.tiny import make_model``.
"""
