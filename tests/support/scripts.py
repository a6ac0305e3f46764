"""Scripts outside the packages (``benchmarks/...``) imported as modules by their tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


@contextmanager
def imported_script(path: Path) -> Iterator[ModuleType]:
    """``path`` imported as the module named after its file (registered in ``sys.modules`` while
    in use, so its dataclasses resolve), removed again afterwards."""
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
