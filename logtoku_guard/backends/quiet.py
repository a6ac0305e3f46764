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

llama.cpp's own log (model loading, warnings about a GGUF file) goes through
:func:`route_llama_cpp_log`: to the Python logger ``llama-cpp-python`` at its real level (errors
shown, warnings and information filtered out), or, verbose, all of it to stderr as llama.cpp writes it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from logtoku_guard.errors import ConfigurationError

__all__ = ["LLAMA_CPP_LOGGER", "VERBOSE_ENV", "is_verbose", "quiet_transformers", "route_llama_cpp_log"]

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


# -- llama.cpp's log -------------------------------------------------------------------------------
LLAMA_CPP_LOGGER = "llama-cpp-python"
"""The Python logger llama.cpp's log goes to (llama-cpp-python's own name for it)."""
GGML_LOG_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
"""ggml's log levels (``ggml.h``: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4; CONT 5 continues the
previous message) as Python's. llama-cpp-python 0.3.36 still maps an older numbering (its
``_logger.py``: 2 -> WARNING, 3 -> ERROR, 4 -> DEBUG), so with its logger at ERROR llama.cpp's
*warnings* were printed (Gemma 3's "control-looking token ... this is probably a bug in the model.
its type will be overridden", a note about the GGUF's token table that llama.cpp repairs on load)
and its *errors* were not."""
_GGML_CONT = 5


class _LlamaCppLog:
    """The C callback: each message to :data:`LLAMA_CPP_LOGGER` at its real level."""

    def __init__(self) -> None:
        self.last = logging.INFO
        self.c_callback: Any = None  # the ctypes function object, kept alive while llama.cpp holds it

    def __call__(self, level: int, text: bytes | None, _user_data: Any) -> None:
        py_level = self.last if level == _GGML_CONT else GGML_LOG_LEVELS.get(level, logging.ERROR)
        self.last = py_level
        logger = logging.getLogger(LLAMA_CPP_LOGGER)
        if text and logger.isEnabledFor(py_level):
            message = text.decode("utf-8", "replace").rstrip("\n")
            if message:
                logger.log(py_level, "%s", message)


_LLAMA_CPP_LOG = _LlamaCppLog()


def route_llama_cpp_log(llama_cpp: Any, verbose: bool) -> None:
    """Where llama.cpp's log goes, for the whole process (``llama_cpp``: the imported module).

    Not verbose: to the logger :data:`LLAMA_CPP_LOGGER` at each message's real level
    (:data:`GGML_LOG_LEVELS`), the logger set to ERROR, so a load prints nothing unless it fails.
    Verbose: llama-cpp-python's own callback, which prints the whole log to stderr.
    """
    logger = logging.getLogger(LLAMA_CPP_LOGGER)
    logger.setLevel(logging.DEBUG if verbose else logging.ERROR)
    if verbose:
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
        return
    if _LLAMA_CPP_LOG.c_callback is None:
        _LLAMA_CPP_LOG.c_callback = llama_cpp.llama_log_callback(_LLAMA_CPP_LOG)
    llama_cpp.llama_log_set(_LLAMA_CPP_LOG.c_callback, ctypes.c_void_p(0))
