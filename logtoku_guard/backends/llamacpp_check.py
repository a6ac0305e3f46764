"""Can the installed llama.cpp build decode on this machine? Asked in a child process, once per build.

llama-cpp-python compiles llama.cpp when it is installed, by default for every instruction the
CPU advertises (``-march=native``). A cloud VM may advertise instructions its hypervisor does not
let it run (AMX, AVX-512): such a build dies with ``SIGILL`` at its first matrix product, and the
process dies with it, with no Python traceback and no message. :func:`ensure_decodes` runs a smoke
decode in a child Python first (load the GGUF, prefill a prompt longer than one ubatch so the
batched kernels run, decode a few tokens with the single-token kernels, check the logits are
finite) and turns a crash there into a :class:`~logtoku_guard.errors.BackendError` that names the
signal, the build and the rebuild to do. :class:`~logtoku_guard.backends.llamacpp.LlamaCppBackend`
calls it before it loads anything into the user's process.

A success is remembered for the process and in the cache folder (``llamacpp-checks/``), keyed by
the installed build (llama-cpp-python's version and the size and time of each of its native
libraries) and the GGUF file, so it is paid once per build and model (about a second for the
embedded model). A failure is never cached: after a rebuild the next use checks again.

``python -m logtoku_guard.backends.llamacpp_check [--model PATH] [--threads N]`` runs the same
check and says what it found (exit status 1: the build cannot decode here; 2: nothing could be
checked, e.g. no model); ``scripts/install.sh`` runs it right
after building llama.cpp, so an install that cannot run stops there.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from logtoku_guard.backends.embedded import EMBEDDED_ALIASES, EMBEDDED_MODEL, embedded_gguf_path
from logtoku_guard.backends.packaged_models import PACKAGED_MODELS, packaged_gguf_path
from logtoku_guard.errors import BackendError, MissingDependencyError, ModelLoadError

__all__ = ["PORTABLE_CMAKE_ARGS", "Build", "SmokeResult", "ensure_decodes", "installed_build", "resolve_gguf", "smoke_decode"]

logger = logging.getLogger(__name__)

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
"""The version the ``llamacpp`` extra pins (pyproject.toml)."""
PORTABLE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
    "-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
"""x86-64-v3 (AVX2, FMA, F16C, BMI2), no AVX-512, no AMX: what ``scripts/install.sh`` builds on x86-64."""
BASELINE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF "
    "-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
"""SSE4.2 only: for an x86-64 CPU where even the portable build cannot run."""
BUILD_MARKER = "llama-cpp-build.txt"
"""What ``scripts/install.sh`` writes into the virtual environment: the version and ``CMAKE_ARGS`` it built with."""
CHECKS_DIR = "llamacpp-checks"
TIMEOUT_S = 600.0
"""Longest a smoke decode may take (loading a large GGUF from a slow disk included)."""

UBATCH = 32
"""The child's ubatch: the smoke prompt is longer, so its prefill takes several batched passes."""
PROMPT_TOKENS = 80
DECODE_TOKENS = 4
_PROMPT = "A careful check of a new build: the quick brown fox jumps over the lazy dog, then rests. " * 8
_EXIT_NOT_LOADED = 3
_EXIT_NOT_FINITE = 4


@dataclass(frozen=True)
class Build:
    """The llama-cpp-python installed beside this library."""

    version: str
    lib_dir: Path
    cmake_args: str | None
    """``CMAKE_ARGS`` of the build when ``scripts/install.sh`` made it; None when built otherwise."""
    fingerprint: str
    """Digest of the version and of every native library's name, size and modification time."""

    def describe(self) -> str:
        how = (
            f'built with CMAKE_ARGS="{self.cmake_args}"'
            if self.cmake_args is not None
            else "built by pip outside scripts/install.sh (llama-cpp-python's default: -march=native, "
            "every instruction this CPU advertises)"
        )
        return f"llama-cpp-python {self.version} in {self.lib_dir}, {how}"

    def rebuild_args(self) -> str:
        """The ``CMAKE_ARGS`` of the build to try next."""
        if self.cmake_args is not None and "-DGGML_AVX2=ON" in self.cmake_args and "-DGGML_NATIVE=OFF" in self.cmake_args:
            return BASELINE_CMAKE_ARGS  # the portable build already failed: drop AVX/AVX2 too
        return PORTABLE_CMAKE_ARGS


@dataclass(frozen=True)
class SmokeResult:
    """What a successful smoke decode measured."""

    seconds: float
    prompt_tokens: int
    decoded_tokens: int
    system_info: str
    """llama.cpp's own list of the CPU features the build uses (``llama_print_system_info``)."""


def installed_build() -> Build:
    """The installed llama-cpp-python (without importing it: importing loads its native libraries)."""
    from logtoku_guard.backends.llamacpp_model import INSTALL_HINT

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        msg = f"the llama.cpp backend needs llama-cpp-python (not installed): {INSTALL_HINT}"
        raise MissingDependencyError(msg)
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    digest = hashlib.sha256(f"{version}\0{lib_dir}".encode())
    if lib_dir.is_dir():
        for path in sorted(lib_dir.iterdir()):
            if path.is_file():
                stat = path.stat()
                digest.update(f"\0{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return Build(version, lib_dir, _marker_args(), digest.hexdigest()[:32])


def _marker_args() -> str | None:
    marker = Path(sys.prefix) / BUILD_MARKER
    try:
        text = marker.read_text(encoding="utf-8")
    except OSError:
        return None
    _, found, args = text.strip().partition("CMAKE_ARGS=")
    return args if found else None


_checked: set[str] = set()
_checked_lock = threading.Lock()


def ensure_decodes(model: Path, *, n_threads: int, cache: bool = True, timeout_s: float = TIMEOUT_S) -> None:
    """Raise :class:`BackendError` unless the installed llama.cpp decodes ``model`` in a child process.

    Done once per process, build and model; with ``cache`` a success is also kept in the cache
    folder for later processes. A child that cannot load the model proves nothing about the build:
    the caller's own load then says what is wrong with the file.
    """
    build = installed_build()
    stat = model.stat()
    key = hashlib.sha256(f"{build.fingerprint}\0{model.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    with _checked_lock:  # concurrent first uses wait for one check
        if key in _checked:
            return
        record = _cache_file(key) if cache else None
        if record is not None and record.is_file():
            _checked.add(key)
            return
        result = smoke_decode(model, n_threads=n_threads, build=build, timeout_s=timeout_s)
        if result is None:
            return
        _checked.add(key)
        if record is not None:
            _remember(record, build, model, result)


def smoke_decode(model: Path, *, n_threads: int, build: Build | None = None, timeout_s: float = TIMEOUT_S) -> SmokeResult | None:
    """Run the smoke decode of ``model`` in a child Python; raise :class:`BackendError` when it crashes.

    Returns None when the child could not load the model (not a build fault).
    """
    build = build or installed_build()
    command = [sys.executable, "-m", "logtoku_guard.backends.llamacpp_check", "--child", str(model), "--threads", str(n_threads)]
    # The child imports what this process imports, wherever it found it (a checkout on sys.path, not installed).
    paths = [p for p in (os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired as exc:
        msg = (
            f"the llama.cpp smoke decode of {str(model)!r} did not finish in {timeout_s:g} s "
            f"({build.describe()}); on a loaded machine pass a longer timeout, else rebuild: {_rebuild_hint(build)}"
        )
        raise BackendError(msg) from exc
    lines = done.stdout.splitlines()
    info = next((line.removeprefix("system_info ") for line in lines if line.startswith("system_info ")), "")
    stages = [line.removeprefix("stage ") for line in lines if line.startswith("stage ")]
    if done.returncode == 0:
        return SmokeResult(time.perf_counter() - started, PROMPT_TOKENS, DECODE_TOKENS, info)
    if done.returncode == _EXIT_NOT_LOADED:
        logger.debug("llama.cpp smoke decode could not load %s: %s", model, _tail(done.stderr))
        return None
    last = f"after: {stages[-1]}" if stages else "before loading the model"
    features = f" Its CPU features: {info}." if info else ""
    if done.returncode < 0:
        number = -done.returncode
        name = _signal_name(number)
        cause = (
            "the build uses CPU instructions this machine cannot run (a CPU or VM may advertise "
            "instructions, such as AMX or AVX-512, that it does not enable)"
            if number == signal.SIGILL
            else "llama.cpp crashed in native code"
        )
        msg = (
            f"llama.cpp was killed by {name} in a check process decoding {model.name} ({last}): {cause}. "
            f"Build: {build.describe()}.{features} Nothing was loaded into this process. "
            f"Rebuild llama.cpp for this machine: {_rebuild_hint(build)}"
        )
    elif done.returncode == _EXIT_NOT_FINITE:
        msg = (
            f"llama.cpp decoded {model.name} to non-finite logits in a check process ({last}): the build "
            f"computes wrongly on this machine. Build: {build.describe()}.{features} Rebuild it: {_rebuild_hint(build)}"
        )
    else:
        msg = (
            f"the llama.cpp smoke decode of {model.name} failed with exit status {done.returncode} ({last}): "
            f"{_tail(done.stderr)} Build: {build.describe()}. If the build is at fault, rebuild it: {_rebuild_hint(build)}"
        )
    raise BackendError(msg)


def _rebuild_hint(build: Build) -> str:
    args = build.rebuild_args()
    return (
        f"CMAKE_ARGS={shlex.quote(args)} pip install --force-reinstall --no-deps --no-cache-dir "
        f"--no-binary llama-cpp-python '{LLAMA_CPP_PYTHON}' (or, in a logtoku-guard checkout: "
        f"CMAKE_ARGS={shlex.quote(args)} bash scripts/install.sh --llamacpp)"
    )


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    text = signal.strsignal(number)
    return f"{name} ({text.lower()})" if text else name


def _tail(text: str, limit: int = 1200) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _cache_file(key: str) -> Path | None:
    from logtoku_guard.backends.embedded import cache_root

    return cache_root() / CHECKS_DIR / f"{key}.json"


def _remember(record: Path, build: Build, model: Path, result: SmokeResult) -> None:
    """Keep a success on disk (atomically); a cache that cannot be written costs a check per process."""
    from logtoku_guard.backends.embedded import private_dir

    body = {
        "build": build.describe(),
        "model": str(model),
        "system_info": result.system_info,
        "seconds": round(result.seconds, 3),
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        folder = private_dir(record.parent)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".check-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(body, handle)
        os.replace(tmp, record)
    except OSError as exc:
        logger.warning(
            "could not remember the llama.cpp check in %s (%s); it will run again in the next process", record.parent, exc
        )


def resolve_gguf(model: str | Path | None) -> tuple[Path, str]:
    """The GGUF file to load and the model's default name."""
    if model is None or (isinstance(model, str) and model in EMBEDDED_ALIASES):
        return embedded_gguf_path(), EMBEDDED_MODEL
    if isinstance(model, str) and model in PACKAGED_MODELS:
        path = packaged_gguf_path(model)
        return path, path.stem  # the name the same file gets when passed by path
    path = Path(model).expanduser()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        msg = (
            f"the llama.cpp backend runs a .gguf file or the embedded model, got {str(model)!r}"
            f"{' (no such file)' if not path.exists() else ''}; pass 'embedded', a packaged model "
            f"({', '.join(sorted(PACKAGED_MODELS))}) or the path of a .gguf file"
        )
        raise ModelLoadError(msg)
    return path, path.stem


# -- the child ----------------------------------------------------------------------------------


def _child(model: str, n_threads: int) -> int:
    """Load ``model``, prefill past one ubatch, decode a few tokens greedily (in the child process)."""
    import numpy as np

    from logtoku_guard.backends.llamacpp_model import LlamaModel, LlamaTokenizer, import_llama_cpp

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()  # what is said before a crash reaches the parent

    lib = import_llama_cpp()
    say("system_info " + " ".join(bytes(lib.llama_print_system_info()).decode("utf-8", "replace").split()))
    try:
        llama = LlamaModel(Path(model), n_ctx=256, n_seq=1, n_threads=n_threads, n_ubatch=UBATCH)
    except ModelLoadError as exc:
        sys.stderr.write(f"{exc}\n")
        return _EXIT_NOT_LOADED
    say("stage loaded the model")
    ids = LlamaTokenizer(llama).encode(_PROMPT)[:PROMPT_TOKENS]
    logits = np.empty(llama.n_vocab, dtype=np.float32)
    llama.decode([(token, pos, 0, pos == len(ids) - 1) for pos, token in enumerate(ids)])
    say(f"stage prefilled {len(ids)} tokens in ubatches of {UBATCH}")
    index = len(ids) - 1
    for step in range(DECODE_TOKENS):
        llama.logits_into(index, logits)
        if not np.isfinite(logits).all():
            sys.stderr.write(f"non-finite logits at step {step}\n")
            return _EXIT_NOT_FINITE
        llama.decode([(int(logits.argmax()), len(ids) + step, 0, True)])
        index = 0
        say(f"stage decoded token {step + 1} of {DECODE_TOKENS}")
    llama.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m logtoku_guard.backends.llamacpp_check``: check the installed build, say what was found."""
    parser = argparse.ArgumentParser(
        prog="python -m logtoku_guard.backends.llamacpp_check",
        description="Check in a child process that the installed llama.cpp build decodes on this machine.",
    )
    parser.add_argument("--model", default="embedded", help="a .gguf file, or 'embedded' (default)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for the smoke decode (default 1)")
    parser.add_argument("--child", metavar="GGUF", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child(args.child, args.threads)
    from logtoku_guard.errors import LogTokUError

    try:
        path, _ = resolve_gguf(args.model)
        build = installed_build()
        result = smoke_decode(path, n_threads=args.threads, build=build)
    except BackendError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except LogTokUError as exc:  # no model, no llama-cpp-python: nothing was checked
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if result is None:
        sys.stderr.write(f"error: llama.cpp could not load {str(path)!r}; pass a .gguf file llama.cpp can run\n")
        return 2
    sys.stdout.write(
        f"llama.cpp decodes on this machine: {build.describe()}; loaded {path.name}, prefilled {result.prompt_tokens} "
        f"tokens and decoded {result.decoded_tokens} in {result.seconds:.1f} s. CPU features: {result.system_info}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
