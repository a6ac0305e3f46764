"""Packaging of the LlamaIndex adapters (llama-index-llms-logtoku, llama-index-embeddings-logtoku-minilm):
namespace merge with llama-index-core and the public API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_index.core")

import llama_index.embeddings.logtoku_minilm as embeddings_pkg
import llama_index.llms.logtoku as llms_pkg

ROOT = Path(__file__).resolve().parents[4]
LLMS = ROOT / "integrations" / "llamaindex" / "llama_index"
EMBEDDINGS = ROOT / "integrations" / "llamaindex-embeddings" / "llama_index"


def test_namespace_folders_have_no_init() -> None:
    for folder in (LLMS, LLMS / "llms", EMBEDDINGS, EMBEDDINGS / "embeddings"):
        assert folder.is_dir() and not (folder / "__init__.py").exists(), folder
    assert (LLMS / "llms" / "logtoku" / "__init__.py").is_file()
    assert (EMBEDDINGS / "embeddings" / "logtoku_minilm" / "__init__.py").is_file()


@pytest.mark.slow
def test_imports_merge_with_llama_index_core_from_any_directory(tmp_path: Path) -> None:
    code = (
        "import llama_index.core, llama_index.llms.logtoku as m, llama_index.embeddings.logtoku_minilm as e;"
        "from llama_index.llms.logtoku import LogTokULLM, LogTokUQueryEngine, LogTokUDecisionEvent;"
        "from llama_index.core.llms import ChatMessage;"
        "print(llama_index.core.__version__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("0.14.")


def test_public_api() -> None:
    assert sorted(llms_pkg.__all__) == [
        "GenerationCapture",
        "LogTokUDecisionEvent",
        "LogTokULLM",
        "LogTokUQueryEngine",
        "capture_generations",
        "captured_aiter",
        "captured_iter",
        "summary_payload",
        "to_core_messages",
        "token_payload",
    ]
    assert sorted(embeddings_pkg.__all__) == ["MODEL_NAME", "MiniLMEmbedding", "packaged_model_dir"]
    for module in (llms_pkg, embeddings_pkg):
        for name in module.__all__:
            assert hasattr(module, name), name


def test_importing_the_core_pulls_in_no_llama_index() -> None:
    code = "import sys, logtoku_guard; print(any(m.startswith('llama_index') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
