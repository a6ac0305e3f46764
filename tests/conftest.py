"""Shared fixtures: a tiny randomly initialised Llama with a tokenizer trained in the test.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a few sentences, the
model a 2-layer Llama built from a config. ``TinyLM`` can be told to emit EOS once a row
holds ``eos_at_length`` real tokens, so batch rows finish at different steps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "What is the capital of France? Paris is a city in Europe.",
    "Uncertainty tells a model when to say I don't know.",
    "Count from one to ten: one, two, three, four, five, six, seven, eight, nine, ten.",
    "Retrieval augmented generation adds context before answering a question.",
    "naïve café déjà vu — unicode text with accents and 日本語 characters.",
]


def make_tokenizer(chat_template: str | None = CHATML) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>", bos_token="<|endoftext|>"
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def make_model(tokenizer: Any, seed: int = 0, max_positions: int = 256) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    class TinyLM(LlamaForCausalLM):
        """A Llama whose raw logits force EOS once a row holds ``eos_at_length`` real tokens."""

        eos_at_length: int | None = None
        nan_at_step: int | None = None
        logit_offset: float = 0.0
        _calls = 0

        def forward(self, input_ids: Any = None, attention_mask: Any = None, **kwargs: Any) -> Any:
            if attention_mask is not None:
                real = attention_mask.sum(-1)
            else:  # transformers drops an all-ones mask for a single row: count cached + new tokens
                cache = kwargs.get("past_key_values")
                past = cache.get_seq_length() if cache is not None else 0
                real = torch.full((input_ids.shape[0],), past + input_ids.shape[1])
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            if self.logit_offset:
                out.logits.add_(self.logit_offset)
            if self.eos_at_length is not None:
                hit = real >= self.eos_at_length
                out.logits[hit, -1, self.config.eos_token_id] = 50.0
            if self.nan_at_step is not None:
                if self._calls == self.nan_at_step:
                    out.logits[:, -1, 5] = float("nan")
                self._calls += 1
            return out

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    model = TinyLM(config)
    # Larger output weights give logits of a few units: a realistic mix of signs for top-K.
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    return make_tokenizer()


@pytest.fixture
def tiny_backend(tiny_tokenizer: Any) -> Any:
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend("tiny", model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer)


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cache folder for the real embedded model: $LOGTOKU_GUARD_CACHE when set, shared by slow tests."""
    env = os.environ.get("LOGTOKU_GUARD_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("ltg-cache")


@pytest.fixture(scope="session")
def embedded_backend(embedded_cache: Path) -> Any:
    pytest.importorskip("gguf")
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend(cache_dir=embedded_cache, device="cpu")
