"""The public surface of ``logtoku_guard``: ``__all__`` derived from what the package exports.

The expected names are not copied by hand: they are the package's eager imports from its own
modules, the lazy names of ``_LAZY`` and ``__version__``; every error class of
:mod:`logtoku_guard.errors` must be public too.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest

import logtoku_guard
import logtoku_guard.errors

HEAVY = ("torch", "transformers", "langchain_core", "llama_index", "llama_cpp")


def _eager_public() -> set[str]:
    """Public names bound in the package namespace by eager imports from logtoku_guard modules."""
    out = set()
    for name, value in vars(logtoku_guard).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if getattr(value, "__module__", "").startswith("logtoku_guard."):
            out.add(name)
    return out


def test_all_is_the_eager_and_lazy_exports() -> None:
    expected = _eager_public() | set(logtoku_guard._LAZY) | {"__version__"}
    assert set(logtoku_guard.__all__) == expected
    assert len(set(logtoku_guard.__all__)) == len(logtoku_guard.__all__)
    names = list(logtoku_guard.__all__)
    assert sorted(names, key=lambda n: (not n.isupper(), not n[:1].isupper(), n)) == names


def test_every_lazy_name_lives_in_its_module() -> None:
    import importlib

    for name, module in logtoku_guard._LAZY.items():
        assert hasattr(importlib.import_module(module), name), f"{name} is not in {module}"


def test_every_error_class_is_public() -> None:
    errors = {
        name
        for name, obj in vars(logtoku_guard.errors).items()
        if inspect.isclass(obj) and issubclass(obj, logtoku_guard.LogTokUError) and obj.__module__ == "logtoku_guard.errors"
    }
    assert errors <= set(logtoku_guard.__all__), f"errors missing from __all__: {sorted(errors - set(logtoku_guard.__all__))}"


@pytest.mark.parametrize("name", logtoku_guard.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(logtoku_guard, name) is not None


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = logtoku_guard.no_such_thing  # type: ignore[attr-defined]


def test_errors_hierarchy_is_exported() -> None:
    g = logtoku_guard
    assert issubclass(g.ConfigurationError, g.LogTokUError) and issubclass(g.ConfigurationError, ValueError)
    assert issubclass(g.PromptTooLongError, g.InvalidPromptError)
    assert issubclass(g.InvalidPromptError, g.ConfigurationError)
    assert issubclass(g.MissingDependencyError, ImportError)
    assert issubclass(g.NonFiniteLogitsError, ArithmeticError)
    assert issubclass(g.PolicyError, g.ConfigurationError) and issubclass(g.DatasetUnavailableError, g.ConfigurationError)
    assert issubclass(g.UsageError, g.LogTokUError) and issubclass(g.GuardRejectedError, g.LogTokUError)
    assert isinstance(g.__version__, str) and g.__version__


def test_every_error_is_drawn_in_the_hierarchy() -> None:
    """Each LogTokUError subclass is in the tree of errors.py's docstring; the one defined
    elsewhere (GuardRejectedError, beside the GuardResult it carries) is a direct child of the root."""
    from logtoku_guard.decision.results import GuardRejectedError

    doc = logtoku_guard.errors.__doc__ or ""
    errors = [
        obj for obj in vars(logtoku_guard.errors).values() if inspect.isclass(obj) and issubclass(obj, logtoku_guard.LogTokUError)
    ]
    for cls in [*errors, GuardRejectedError]:
        assert f" {cls.__name__} " in doc or f" {cls.__name__}\n" in doc, (
            f"{cls.__name__} is not drawn in the hierarchy of logtoku_guard.errors"
        )
        assert getattr(logtoku_guard, cls.__name__) is cls
    assert GuardRejectedError.__bases__ == (logtoku_guard.LogTokUError,)


def test_import_is_light() -> None:
    code = f"import logtoku_guard, sys; heavy = [m for m in {HEAVY!r} if m in sys.modules]; print('HEAVY=' + ','.join(heavy))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "HEAVY=", f"import logtoku_guard loaded: {proc.stdout.strip()[6:]}"


@pytest.mark.slow
def test_light_import_check_can_fail() -> None:
    """The subprocess probe really sees a heavy import (guards against a vacuous check)."""
    code = (
        "import logtoku_guard, sys; logtoku_guard.logtoku(__import__('torch').tensor([1.0, 2.0])); print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def test_every_error_class_is_in_the_hierarchy_and_exported() -> None:
    import logtoku_guard.audit.waiting
    import logtoku_guard.backends.openai_compat
    import logtoku_guard.decision.results

    def subclasses(cls: type) -> set[type]:
        return {c for s in cls.__subclasses__() for c in {s, *subclasses(s)}}

    errors = {c for c in subclasses(logtoku_guard.LogTokUError) if c.__module__.startswith("logtoku_guard")}
    doc = logtoku_guard.errors.__doc__ or ""
    assert {"RemoteServerError", "LogProbsNotLogitsError", "ReviewTimeoutError"} <= {c.__name__ for c in errors}
    for cls in errors:
        assert cls.__name__ in logtoku_guard.__all__ and getattr(logtoku_guard, cls.__name__) is cls, cls
        assert cls.__name__ in doc, f"{cls.__name__} is not drawn in the hierarchy of logtoku_guard.errors"
        assert cls.__module__ in ("logtoku_guard.errors", "logtoku_guard.decision.results"), f"{cls} is defined outside errors.py"
