"""--model gemma3-270m: a GGUF shipped as PyPI chunk packages, joined once into the cache (a fake
package here, with the real one's interface; the real Gemma run is in RESULTS section 10)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from logtoku_guard.backends.packaged_models import PACKAGED_MODELS, PackagedModel, packaged_gguf_path
from logtoku_guard.errors import MissingDependencyError, ModelLoadError

CHUNKS = [b"GGUF" + b"a" * 1000, b"b" * 500]

FAKE = """
from pathlib import Path
MODEL_NAME = "fake-model.gguf"
EXPECTED_SHA256 = "{sha}"
CALLS = []
CHUNKS = {chunks!r}

def assemble(output_path=None, overwrite=False):
    CALLS.append(output_path)
    target = Path(output_path)
    target.write_bytes(b"".join(CHUNKS))
    import hashlib
    if hashlib.sha256(target.read_bytes()).hexdigest() != EXPECTED_SHA256:
        raise ValueError("Assembled file sha256 did not match expected value")
    return target
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def install(chunks: list[bytes], sha: str | None = None) -> object:
        name = f"fake_gguf_{len(sys.modules)}"
        (tmp_path / "site" / name).mkdir(parents=True)
        digest = sha or hashlib.sha256(b"".join(chunks)).hexdigest()
        (tmp_path / "site" / name / "__init__.py").write_text(FAKE.format(sha=digest, chunks=chunks), encoding="utf-8")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        monkeypatch.setitem(PACKAGED_MODELS, "fake-1b", PackagedModel(name, "fake-gguf", "fake", "test licence"))
        import importlib

        return importlib.import_module(name)

    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(tmp_path / "cache"))
    return install


def test_the_chunks_are_joined_once_into_the_cache(fake, tmp_path: Path) -> None:
    module = fake(CHUNKS)
    path = packaged_gguf_path("fake-1b")
    assert path == tmp_path / "cache" / "models" / "fake-model.gguf" and path.read_bytes() == b"".join(CHUNKS)
    assert packaged_gguf_path("fake-1b") == path and len(module.CALLS) == 1  # type: ignore[attr-defined]
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".assemble-")] == []
    assert {oct(p.stat().st_mode & 0o777) for p in path.parent.iterdir()} == {"0o600"}  # owner-only, as the cache
    path.write_bytes(b"GGUF truncated")  # a damaged file: its size no longer matches the record, so it is joined again
    assert packaged_gguf_path("fake-1b").read_bytes() == b"".join(CHUNKS) and len(module.CALLS) == 2  # type: ignore[attr-defined]


def test_chunks_that_do_not_make_the_file_leave_nothing_half_written(fake, tmp_path: Path) -> None:
    fake(CHUNKS, sha="0" * 64)
    with pytest.raises(ModelLoadError, match=r"do not make the expected file .*pip install 'logtoku-guard\[fake\]'"):
        packaged_gguf_path("fake-1b")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_a_missing_package_or_an_unknown_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = PackagedModel("no_such_gguf_package", "no-such-gguf", "nosuch", "test licence")
    monkeypatch.setitem(PACKAGED_MODELS, "absent-1b", absent)
    with pytest.raises(
        MissingDependencyError, match=r"'no-such-gguf', which is not installed; run: pip install 'logtoku-guard\[nosuch\]'"
    ):
        packaged_gguf_path("absent-1b")
    with pytest.raises(ModelLoadError, match=r"no packaged model is called 'gemma-7b'.*'gemma3-270m'"):
        packaged_gguf_path("gemma-7b")
    assert PACKAGED_MODELS["gemma3-270m"].install == "pip install 'logtoku-guard[gemma3]'"


def test_the_llamacpp_backend_resolves_a_packaged_name_as_the_same_file_by_path(fake) -> None:
    from logtoku_guard.backends.llamacpp_check import resolve_gguf

    fake(CHUNKS)
    path, name = resolve_gguf("fake-1b")
    assert path == packaged_gguf_path("fake-1b") and name == "fake-model" == resolve_gguf(str(path))[1]
