"""Tiny models built in the test, nothing downloaded: tokenizers trained on a few sentences and
a 2-layer Llama with random weights.

- :func:`make_tokenizer`: a byte-level BPE (GPT-2 style) with a ChatML template.
- :func:`sentencepiece_tokenizer`: a Llama-2-style tokenizer (``▁`` prefixes, byte fallback).
- :func:`make_model`: a :class:`TinyLM` for a tokenizer. ``TinyLM`` can be told to emit EOS
  once a row holds ``eos_at_length`` real tokens (batch rows then finish at different steps),
  to write NaN into the logits at one forward pass (``nan_at_step``) or to shift every logit
  (``logit_offset``).

The fixtures built on them (``tiny_tokenizer``, ``tiny_backend``) are in the root ``conftest.py``.
"""

from __future__ import annotations

import json
from typing import Any

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
                cache = kwargs["cache"] if "cache" in kwargs else kwargs.get("past_key_values")  # the name before 5.24
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


def sentencepiece_tokenizer() -> Any:
    """A Llama-2-style tokenizer: ``▁`` word prefixes, byte fallback, and a decoder that strips the
    leading space of the first token it decodes, so a token's text depends on the token before."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # byte-fallback tokens: ordinary (not special) tokens, as in Llama's vocabulary
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), eos_token="</s>", bos_token="<s>", unk_token="<unk>"
    )


def save_plain(model: Any, tokenizer: Any, folder: Any) -> None:
    """Save ``model``'s weights as a plain ``LlamaForCausalLM`` folder (``TinyLM`` is test-only) with ``tokenizer``."""
    from transformers import LlamaForCausalLM

    plain = LlamaForCausalLM(model.config)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
