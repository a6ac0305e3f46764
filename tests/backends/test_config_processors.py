"""The logits processors built from a GenerationConfig with transformers' public classes.

The oracle is ``generate``'s own (private) builder, ``GenerationMixin._get_logits_processor``:
on several configs, prompts and answer histories, our per-row processors followed by the
batched warpers must give the scores its list gives. Then the backend's greedy answer with
those processors equals ``model.generate``'s, and what the decode loop cannot apply is refused.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from support.tiny import make_model
from transformers import GenerationConfig, LogitsProcessorList

from logtoku_guard import ConfigurationError, DecodingOptions, DynamicTemperature
from logtoku_guard.backends.processors import (
    DynamicTemperatureLogitsWarper,
    check_generation_config,
    row_processors,
    sampling_warpers,
)
from logtoku_guard.backends.transformers import TransformersBackend

EOS = [2, 7]


def step_eu() -> torch.Tensor:
    """The EU the dynamic temperature reads at every step."""
    return torch.tensor([0.4])


CONFIGS: dict[str, dict[str, Any]] = {
    "greedy penalties": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "min_new_tokens": 3},
    "sampling warpers": {
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.9,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
    },
    "typical and cut-offs": {
        "do_sample": True,
        "typical_p": 0.8,
        "epsilon_cutoff": 3e-4,
        "eta_cutoff": 1e-3,
        "renormalize_logits": True,
    },
    "banned and suppressed": {
        "bad_words_ids": [[5], [11, 12]],
        "suppress_tokens": [3, 4],
        "begin_suppress_tokens": [9],
        "min_length": 12,
        "sequence_bias": [[[10], -2.0], [[13, 14], 3.0]],
    },
    "prompt penalties and forced tokens": {
        "do_sample": True,
        "top_h": 0.6,
        "encoder_repetition_penalty": 1.5,
        "encoder_no_repeat_ngram_size": 2,
        "exponential_decay_length_penalty": (2, 1.5),
        "forced_bos_token_id": 1,
        "forced_eos_token_id": 2,
        "remove_invalid_values": True,
    },
}


@pytest.fixture(scope="module")
def model(tiny_tokenizer: Any) -> Any:
    return make_model(tiny_tokenizer)


def oracle(model: Any, config: GenerationConfig, prompt: torch.Tensor, custom: list[Any]) -> LogitsProcessorList:
    """``generate``'s list for ``config`` (prepared as ``generate`` prepares it)."""
    config = copy.deepcopy(config)
    model._prepare_special_tokens(config, True, "cpu")
    return model._get_logits_processor(
        config,
        input_ids_seq_length=prompt.shape[1],
        encoder_input_ids=prompt,
        logits_processor=LogitsProcessorList(custom),
        device="cpu",
    )


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dynamic", [False, True])
def test_the_processors_give_generates_scores(model: Any, name: str, dynamic: bool) -> None:
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    vocab = model.config.vocab_size
    max_new = 4
    for prompt_len in (1, 6, 11):
        prompt = torch.randint(3, 30, (1, prompt_len), generator=gen)
        config = GenerationConfig(**CONFIGS[name], eos_token_id=EOS, pad_token_id=0, max_length=prompt_len + max_new)
        custom = [DynamicTemperatureLogitsWarper(DynamicTemperature(t_max=1.5, t_min=0.3), step_eu)] if dynamic else []
        expected_list = oracle(model, config, prompt, custom)
        rows = row_processors(config, prompt[0].tolist(), max_new, "cpu")
        warpers = sampling_warpers(config, "cpu", custom)
        assert [type(p) for p in [*rows, *warpers]] == [type(p) for p in expected_list]
        for answered in (0, 1, 3, 8):  # 3: the forced EOS step (prompt + 3 = max_length - 1)
            answer = prompt[0, torch.randint(0, prompt_len, (answered,), generator=gen)]  # repeats the prompt's tokens
            ids = torch.cat([prompt, answer[None]], dim=1)
            scores = torch.randn((1, vocab), generator=gen) * 3
            scores[0, 20] = float("-inf")
            expected = expected_list(ids, scores.clone())
            got = warpers(ids, rows(ids, scores.clone()))
            torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
            assert not torch.equal(got, scores), f"{name}: no processor changed the scores, the comparison proves nothing"


def test_greedy_answer_equals_generate_with_the_configs_processors(tiny_tokenizer: Any) -> None:
    model = make_model(tiny_tokenizer, seed=3)
    model.generation_config.update(no_repeat_ngram_size=2, suppress_tokens=[5, 6], sequence_bias=[[[8], 4.0]], min_new_tokens=4)
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    g = backend.generate("What is the capital of France?", DecodingOptions(max_new_tokens=16))
    enc = tiny_tokenizer(backend.render("What is the capital of France?"), return_tensors="pt", add_special_tokens=False)
    ref = model.generate(**enc, max_new_tokens=16, do_sample=False)
    generated = ref[0, enc["input_ids"].shape[1] :].tolist()
    eos = tiny_tokenizer.eos_token_id
    assert [t.id for t in g.tokens] == generated[: generated.index(eos) if eos in generated else len(generated)]
    assert not {5, 6} & {t.id for t in g.tokens}


@pytest.mark.parametrize(
    ("field", "value"),
    [("guidance_scale", 1.5), ("watermarking_config", {"greenlist_ratio": 0.25})],
)
def test_a_config_the_loop_cannot_apply_is_refused_naming_the_field(tiny_tokenizer: Any, field: str, value: Any) -> None:
    config = GenerationConfig(**{field: value})
    with pytest.raises(ConfigurationError, match=rf"sets {field}=.*unset it \(model\.generation_config\.{field} = None\)"):
        check_generation_config(config)
    model = make_model(tiny_tokenizer)
    setattr(model.generation_config, field, getattr(config, field))
    with pytest.raises(ConfigurationError, match=field):  # at load, not at the first generation
        TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)


def test_guidance_scale_one_is_no_guidance() -> None:
    check_generation_config(GenerationConfig(guidance_scale=1.0))
