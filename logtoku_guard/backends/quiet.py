"""Keeping transformers quiet around our own calls to it, unless asked.

Loading or converting a model makes transformers draw progress bars ("Loading weights",
"Writing model shards", "Converting and de-quantizing GGUF tensors...") and may log warnings
meant for its own ``generate``; a command-line answer or a server log should not carry them.
:func:`quiet_transformers` turns transformers' progress bars off (its public switch, which
also covers huggingface_hub's) and raises its logger (``"transformers"``, the one its
``utils.logging`` configures) to ERROR for the duration of a block, then restores both. With
``gguf=True`` the GGUF de-quantisation's bar, which transformers draws with tqdm directly
outside its switch, is off too (its reader's ``tqdm`` is a disabled one for the block). Nested
and concurrent blocks (a load in one thread while the batcher generates in another) share one
save/restore: the first to enter saves the settings, the last to leave puts them back, so a
block never restores another's quiet state as the user's.

Nothing else is touched: not the root logger, not another library's logger, not Python's
warning filters (the deprecation warnings a forward pass could raise are avoided at their
source: :mod:`~logtoku_guard.backends.hf_compat`). Errors are still logged.

``verbose=True``, or ``LOGTOKU_GUARD_VERBOSE=1`` in the environment, leaves transformers'
output as it is.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from logtoku_guard.errors import ConfigurationError

__all__ = ["VERBOSE_ENV", "is_verbose", "quiet_transformers"]

VERBOSE_ENV = "LOGTOKU_GUARD_VERBOSE"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


class _Shared:
    """One process-wide setting silenced by nested or concurrent blocks: the first to enter
    saves it and silences it, the last to leave restores it."""

    def __init__(self, save: Callable[[], Any], silence: Callable[[Any], None], restore: Callable[[Any], None]) -> None:
        self._save, self._silence, self._restore = save, silence, restore
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: Any = None

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._saved = self._save()
                self._silence(self._saved)
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    saved, self._saved = self._saved, None
                    self._restore(saved)


def is_verbose(verbose: bool | None = None) -> bool:
    """Whether transformers may print: ``verbose`` when given, else ``$LOGTOKU_GUARD_VERBOSE`` (default off)."""
    if verbose is not None:
        if not isinstance(verbose, bool):
            msg = f"verbose must be True, False or None (None: ${VERBOSE_ENV}), got {verbose!r}"
            raise ConfigurationError(msg)
        return verbose
    value = os.environ.get(VERBOSE_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    msg = f"${VERBOSE_ENV} must be 1 (let transformers print its progress bars and warnings) or 0, got {value!r}"
    raise ConfigurationError(msg)


@contextmanager
def quiet_transformers(verbose: bool | None = None, *, gguf: bool = False) -> Iterator[None]:
    """No transformers progress bars and no transformers warnings inside the block (see the module docstring).

    ``gguf``: also no bar from the GGUF de-quantisation (a ``.gguf`` file is read in the block).
    """
    if is_verbose(verbose):
        yield
        return
    with _LOGS.held():
        if not gguf:
            yield
            return
        with _GGUF.held():
            yield


def _save_logs() -> tuple[int, bool]:
    from transformers.utils import logging as hf_logging

    return logging.getLogger("transformers").level, hf_logging.is_progress_bar_enabled()


def _silence_logs(saved: tuple[int, bool]) -> None:
    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    if saved[1]:
        hf_logging.disable_progress_bar()


def _restore_logs(saved: tuple[int, bool]) -> None:
    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers").setLevel(saved[0])
    if saved[1]:
        hf_logging.enable_progress_bar()


def _gguf_module() -> Any:
    """transformers' GGUF reader module (None without the ``gguf`` package)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        return None
    return importlib.import_module("transformers.modeling_gguf_pytorch_utils")


def _save_gguf() -> Any:
    module = _gguf_module()
    return getattr(module, "tqdm", None) if module is not None else None


def _silence_gguf(original: Any) -> None:
    # The de-quantisation draws its bar with tqdm directly, outside transformers' switch.
    if original is not None:
        _gguf_module().tqdm = functools.partial(original, disable=True)


def _restore_gguf(original: Any) -> None:
    if original is not None:
        _gguf_module().tqdm = original


_LOGS = _Shared(_save_logs, _silence_logs, _restore_logs)
_GGUF = _Shared(_save_gguf, _silence_gguf, _restore_gguf)
