"""Helpers shared by the test modules (not tests themselves).

``tests/`` has no ``__init__.py``: pytest (rootdir-relative "prepend" import mode) puts
``tests/`` on ``sys.path`` when it loads ``tests/conftest.py``, so every test module, in any
folder under ``tests/``, imports these as ``from support.tiny import make_model``.
"""
