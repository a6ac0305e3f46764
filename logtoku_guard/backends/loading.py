"""Loading a local model for :class:`~logtoku_guard.backends.transformers.TransformersBackend`.

Where a model may come from, nothing ever downloaded: the embedded default
(:mod:`logtoku_guard.embedded`, converted once into a cache), a local transformers folder,
a ``.gguf`` file (or a folder holding one), or a Hugging Face model id already in the local
hub cache. torch and transformers are imported when a model is loaded, not before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from logtoku_guard.embedded import EMBEDDED_ALIASES, EMBEDDED_MODEL, ProgressCallback, ensure_embedded_model
from logtoku_guard.errors import ConfigurationError, ModelLoadError

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Accepted ``dtype`` values; ``auto`` is float32 on CPU, bfloat16 on CUDA."""


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available else ``"cpu"``; a CUDA device without CUDA is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        msg = f"device={device!r} but no CUDA device is available; use device='cpu' or 'auto'"
        raise ConfigurationError(msg)
    return device


def load_model(
    model: str | Path | None,
    device: str,
    dtype: str,
    cache_dir: str | Path | None,
    progress: ProgressCallback | None,
) -> tuple[Any, Any, str]:
    """Load ``(model, tokenizer, name)`` from local files only; raises :class:`ModelLoadError`.

    ``model``: ``None`` or an alias of the embedded default, a folder, a ``.gguf`` file, or a
    cached hub id. ``dtype`` is one of :data:`DTYPES`; the model is moved to ``device``.
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
        folder = ensure_embedded_model(cache_dir, progress)
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
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError) as exc:
        msg = (
            f"could not load model {name!r} from local files ({exc.__class__.__name__}: {str(exc).splitlines()[0]}); "
            f"nothing is downloaded at run time: pass a local folder or .gguf file, put the model in the "
            f"Hugging Face cache beforehand, or use the embedded default {EMBEDDED_MODEL!r}"
        )
        raise ModelLoadError(msg) from exc
    loaded = loaded.to(dev)  # type: ignore[arg-type]
    return loaded, tokenizer, name
