"""Loading a local model for :class:`~logtoku_guard.backends.transformers.TransformersBackend`.

Where a model may come from, nothing ever downloaded: the embedded default
(:mod:`logtoku_guard.backends.embedded`, converted once into a cache), a local transformers folder,
a ``.gguf`` file (or a folder holding one), or a Hugging Face model id already in the local
hub cache. torch and transformers are imported when a model is loaded, not before.

Every failure is a :class:`~logtoku_guard.errors.LogTokUError` naming the value and the fix:
a bad ``device`` string (:func:`validate_device`, checked without loading anything), a folder
with no model in it, a truncated or foreign ``.gguf`` file, a converted embedded-model cache
that this transformers version cannot read.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

from logtoku_guard.backends.embedded import (
    EMBEDDED_ALIASES,
    EMBEDDED_MODEL,
    ProgressCallback,
    converted_by,
    ensure_embedded_model,
)
from logtoku_guard.backends.quiet import quiet_transformers
from logtoku_guard.errors import ConfigurationError, ModelLoadError

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Accepted ``dtype`` values; ``auto`` is float32 on CPU, bfloat16 on CUDA."""

_DEVICE = re.compile(r"(auto|cpu|mps|cuda(:\d+)?)")
_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def validate_device(device: str) -> str:
    """Check a ``device`` string (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``, or any torch device).

    The usual names are checked without importing torch; anything else is parsed by
    ``torch.device``. Raises :class:`ConfigurationError` naming the value and the choices.
    """
    if isinstance(device, str) and _DEVICE.fullmatch(device):
        return device
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        msg = f"device {device!r} is not a device; use 'auto', 'cpu', 'cuda', 'cuda:N' (N = GPU index) or 'mps'"
        raise ConfigurationError(msg) from exc
    return device


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available else ``"cpu"``; a CUDA device without CUDA is an error."""
    import torch

    validate_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        msg = f"device={device!r} but no CUDA device is available; use device='cpu' or 'auto'"
        raise ConfigurationError(msg)
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        msg = f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) exist; use 'cuda:0' or 'auto'"
        raise ConfigurationError(msg)
    return device


def load_model(
    model: str | Path | None,
    device: str,
    dtype: str,
    cache_dir: str | Path | None,
    progress: ProgressCallback | None,
    verbose: bool | None = None,
) -> tuple[Any, Any, str]:
    """Load ``(model, tokenizer, name)`` from local files only; raises :class:`ModelLoadError`.

    ``model``: ``None`` or an alias of the embedded default, a folder, a ``.gguf`` file, or a
    cached hub id. ``dtype`` is one of :data:`DTYPES`; the model is moved to ``device``.
    transformers draws no progress bars and logs no warnings meanwhile unless ``verbose``
    (None: ``$LOGTOKU_GUARD_VERBOSE``; :mod:`~logtoku_guard.backends.quiet`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch_dtype = {
        "auto": torch.float32 if dev == "cpu" else torch.bfloat16,
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }[dtype]
    name = str(model) if model is not None else EMBEDDED_MODEL
    kwargs: dict[str, Any] = {}
    if name in EMBEDDED_ALIASES:
        folder = ensure_embedded_model(cache_dir, progress, verbose=verbose)
        name = EMBEDDED_MODEL
        source: str | Path = folder
    else:
        path = Path(name).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            source, kwargs["gguf_file"] = path.parent, path.name
        elif path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            if not (path / "config.json").exists() and ggufs:
                kwargs["gguf_file"] = ggufs[0].name
            elif not (path / "config.json").exists() or not any(any(path.glob(w)) for w in _WEIGHTS):
                msg = (
                    f"model folder {name!r} has no config.json and model weights (*.safetensors, *.bin) nor a .gguf file; "
                    f"pass a folder written by save_pretrained(), a .gguf file, or {EMBEDDED_MODEL!r}"
                )
                raise ModelLoadError(msg)
            source = path
        elif path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
            msg = (
                f"model path {name!r} does not exist or is not a model folder / .gguf file; "
                f"pass an existing folder, a .gguf file, or {EMBEDDED_MODEL!r}"
            )
            raise ModelLoadError(msg)
        else:
            source = name  # a hub id: local cache only
    if progress:
        progress(f"Loading {name}")
    try:
        with quiet_transformers(verbose, gguf="gguf_file" in kwargs):
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **kwargs)
            loaded = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=torch_dtype, **kwargs)
    except MemoryError:
        raise
    except Exception as exc:  # transformers, gguf and safetensors raise many types for unreadable files
        first = f"{exc.__class__.__name__}: {(str(exc).splitlines() or [''])[0]}"
        if name == EMBEDDED_MODEL:
            writer = converted_by(Path(source))
            by = f" (written by transformers {writer})" if writer else ""
            msg = (
                f"the converted embedded model in {str(source)!r}{by} could not be loaded by transformers "
                f"{_transformers_version()} ({first}); delete that folder and the model is converted again on next use"
            )
            raise ModelLoadError(msg) from exc
        if "gguf_file" in kwargs:
            gguf = Path(source) / kwargs["gguf_file"]
            msg = (
                f"could not read the GGUF file {str(gguf)!r} ({first}); it may be truncated or not a GGUF model: "
                f"copy it again, or pass another model or {EMBEDDED_MODEL!r}"
            )
            raise ModelLoadError(msg) from exc
        msg = (
            f"could not load model {name!r} from local files ({first}); "
            f"nothing is downloaded at run time: pass a local folder or .gguf file, put the model in the "
            f"Hugging Face cache beforehand, or use the embedded default {EMBEDDED_MODEL!r}"
        )
        raise ModelLoadError(msg) from exc
    loaded = loaded.to(dev)  # type: ignore[arg-type]
    return loaded, tokenizer, name


def _transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"
