"""TransformersBackend on a tiny random Llama: raw-logit capture, decoding, streaming, batching."""

from __future__ import annotations

import gc
import itertools
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support.tiny import make_model, make_tokenizer, save_plain, sentencepiece_tokenizer

from logtoku_guard import (
    ConfigurationError,
    DecodingOptions,
    DynamicTemperature,
    InvalidPromptError,
    ModelLoadError,
    NonFiniteLogitsError,
    PromptTooLongError,
    logtoku,
)
from logtoku_guard.backends.detokenizer import MAX_PENDING, IncrementalDetokenizer
from logtoku_guard.backends.transformers import NoChatTemplateWarning, TransformersBackend

QUESTION = "What is the capital of France?"


def recompute(tokens: Any, k: int = 2) -> tuple[list[float], list[float]]:
    au, eu = logtoku(torch.tensor([t.top_logits[:k] for t in tokens], dtype=torch.float64))
    return au.tolist(), eu.tolist()


def test_scores_match_the_formulas_on_the_captured_logits(tiny_backend: TransformersBackend) -> None:
    g = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=12))
    assert len(g.tokens) == 12 and g.finish_reason == "length"
    au, eu = recompute(g.tokens)
    for t, a, e in zip(g.tokens, au, eu):
        assert len(t.top_logits) == 2 and t.top_logits[0] >= t.top_logits[1]
        assert t.au == pytest.approx(a, abs=1e-5) and t.eu == pytest.approx(e, abs=1e-5)
        assert t.logprob <= 0 and t.entropy >= 0
        assert t.id == t.top_ids[0]  # greedy picks the arg-max of the raw logits (no processor here)
    assert g.text == "".join(t.text for t in g.tokens)
    assert g.prompt == QUESTION and g.prompt_tokens > 0 and g.timings.total_s > 0


def test_captures_raw_logits_even_with_repetition_penalty(tiny_tokenizer: Any) -> None:
    """The model's generation config enables a repetition penalty (a built-in pre-processor):
    what we record must still equal the raw model output, not the penalised scores."""
    model = make_model(tiny_tokenizer, seed=3)
    model.generation_config.repetition_penalty = 1.8
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, k=3)
    g = backend.generate(QUESTION, DecodingOptions(max_new_tokens=15))

    enc = tiny_tokenizer(backend.render(QUESTION), return_tensors="pt", add_special_tokens=False)
    ref = model.generate(
        **enc,
        max_new_tokens=15,
        do_sample=False,
        repetition_penalty=1.8,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
    )
    generated = ref.sequences[0, enc["input_ids"].shape[1] :].tolist()
    eos = tiny_tokenizer.eos_token_id
    n = generated.index(eos) if eos in generated else len(generated)
    assert [t.id for t in g.tokens] == generated[:n]
    penalised_differs = False
    for step, t in enumerate(g.tokens):
        raw = ref.logits[step][0]
        values, ids = raw.topk(3)
        assert torch.allclose(torch.tensor(t.top_logits), values, atol=1e-5)
        assert list(t.top_ids) == ids.tolist()
        assert t.logprob == pytest.approx(torch.log_softmax(raw, -1)[t.id].item(), abs=1e-4)
        penalised_differs |= not torch.allclose(ref.scores[step][0].topk(3).values, values)
    assert penalised_differs, "the penalty never changed the top-K: the test would not catch processed logits"


def test_memory_grows_with_k_not_vocabulary(tiny_backend: TransformersBackend) -> None:
    g = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=20))
    for t in g.tokens:
        for value in (t.top_logits, t.top_ids):
            assert isinstance(value, tuple) and len(value) == tiny_backend.k
        assert not any(isinstance(v, torch.Tensor) for v in vars(t).values()) if hasattr(t, "__dict__") else True
        assert all(not isinstance(getattr(t, f), torch.Tensor) for f in t.__slots__)  # type: ignore[attr-defined]


def test_chat_template_and_plain_prompt_fallback() -> None:
    with_template = TransformersBackend("tiny", model_obj=make_model(make_tokenizer()), tokenizer=make_tokenizer())
    rendered = with_template.render([{"role": "user", "content": "hi"}], system="be brief")
    assert rendered == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    plain_tok = make_tokenizer(chat_template=None)
    plain = TransformersBackend("tiny", model_obj=make_model(plain_tok), tokenizer=plain_tok)
    with pytest.warns(NoChatTemplateWarning, match="no chat template"):
        g = plain.generate("hello there", DecodingOptions(max_new_tokens=3))
    assert len(g.tokens) == 3
    assert plain.render("hello there") == "hello there"
    assert plain.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]).endswith("assistant:")


def test_multi_token_stop_string_cuts_text_and_tokens(tiny_backend: TransformersBackend) -> None:
    full = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=30))
    pieces = [t.text for t in full.tokens]
    # A stop string spanning the end of token 6 and the start of token 8.
    start = sum(len(p) for p in pieces[:6]) - 1
    end = sum(len(p) for p in pieces[:8]) + 1
    stop = full.text[start:end]
    assert len(stop) >= 3
    cut = full.text.find(stop)
    g = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=30, stop=(stop, "never-there")))
    assert g.finish_reason == "stop" and g.stop_sequence == stop
    assert g.text == full.text[:cut]
    assert "".join(t.text for t in g.tokens) == g.text
    assert [t.id for t in g.tokens] == [t.id for t in full.tokens[: len(g.tokens)]]
    with tiny_backend.stream(QUESTION, DecodingOptions(max_new_tokens=30, stop=(stop,))) as s:
        streamed = list(s)
    assert "".join(t.text for t in streamed) == g.text
    assert s.generation.finish_reason == "stop"


def test_max_new_tokens_and_seeded_sampling(tiny_backend: TransformersBackend) -> None:
    a = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=15, temperature=1.5, seed=7))
    b = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=15, temperature=1.5, seed=7))
    c = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=15, temperature=1.5, seed=8))
    assert [t.id for t in a.tokens] == [t.id for t in b.tokens]
    assert [t.id for t in a.tokens] != [t.id for t in c.tokens]
    greedy = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=15))
    assert [t.id for t in a.tokens] != [t.id for t in greedy.tokens]
    assert len(a.tokens) == 15 and a.finish_reason == "length"
    # Scores come from the raw logits, so they do not depend on the sampling temperature.
    _au, eu = recompute(a.tokens)
    assert [t.eu for t in a.tokens] == pytest.approx(eu, abs=1e-5)


def test_stream_yields_each_token_with_its_scores_before_the_end(tiny_backend: TransformersBackend) -> None:
    reference = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=16))
    stream = tiny_backend.stream(QUESTION, DecodingOptions(max_new_tokens=16))
    received = []
    for i, token in enumerate(stream):
        if i == 0:
            with pytest.raises(Exception, match="not finished"):
                _ = stream.generation  # the first token arrived while generation was still running
        received.append(token)
    assert [(t.id, t.text, t.au, t.eu) for t in received] == [(t.id, t.text, t.au, t.eu) for t in reference.tokens]
    assert [t.index for t in received] == list(range(16))
    assert stream.generation.text == reference.text


def test_closing_a_stream_cancels_generation(tiny_backend: TransformersBackend) -> None:
    with tiny_backend.stream(QUESTION, DecodingOptions(max_new_tokens=200)) as stream:
        for i, _ in enumerate(stream):
            if i == 2:
                break
    g = stream.generation
    assert g.finish_reason == "cancelled" and 3 <= len(g.tokens) < 200
    assert not any(t.name == "logtoku-generate" for t in threading.enumerate())


def slow_backend(tokenizer: Any, seconds_per_step: float = 0.05) -> TransformersBackend:
    """A tiny model whose every forward pass takes ``seconds_per_step`` (200 steps = 10 s)."""
    model = make_model(tokenizer)
    model.register_forward_pre_hook(lambda module, args: time.sleep(seconds_per_step))
    return TransformersBackend("tiny", model_obj=model, tokenizer=tokenizer)


def generate_within(backend: TransformersBackend, seconds: float) -> Any:
    """``generate()`` in a thread; fails (instead of hanging) if it does not finish in ``seconds``.

    A seeded sampled request shares the batch with whatever runs (its own temperature and stream).
    """
    done: list[Any] = []
    options = DecodingOptions(max_new_tokens=2, temperature=0.7, seed=1)
    worker = threading.Thread(target=lambda: done.append(backend.generate(QUESTION, options)))
    worker.start()
    worker.join(timeout=seconds)
    assert done, f"generate() still waits for the model lock after {seconds} s: the abandoned stream kept generating"
    return done[0]


def test_a_dropped_stream_stops_generating_and_frees_the_model_lock(tiny_tokenizer: Any) -> None:
    backend = slow_backend(tiny_tokenizer)
    stream = backend.stream(QUESTION, DecodingOptions(max_new_tokens=200))
    tokens = iter(stream)
    next(tokens)  # one token read, then the stream is abandoned
    del stream, tokens
    gc.collect()
    assert len(generate_within(backend, 5.0).tokens) == 2


def test_a_half_read_stream_iterator_stops_generating(tiny_tokenizer: Any) -> None:
    backend = slow_backend(tiny_tokenizer)
    stream = backend.stream(QUESTION, DecodingOptions(max_new_tokens=200))
    for _ in stream:
        break  # the loop's iterator is dropped; the stream object itself is still held
    generate_within(backend, 5.0)
    stream.close()
    g = stream.generation
    assert g.finish_reason == "cancelled" and len(g.tokens) < 200


def test_an_abandoned_stream_in_a_reference_cycle_is_stopped_when_the_lock_is_needed(tiny_tokenizer: Any) -> None:
    backend = slow_backend(tiny_tokenizer)
    gc.disable()  # only the backend's own collection may find the cycle
    try:
        holder: dict[str, Any] = {"stream": backend.stream(QUESTION, DecodingOptions(max_new_tokens=200))}
        holder["self"] = holder
        time.sleep(0.2)  # generation has started and holds the lock
        del holder
        generate_within(backend, 5.0)
    finally:
        gc.enable()


def test_stream_reraises_errors_from_the_worker(tiny_tokenizer: Any) -> None:
    model = make_model(tiny_tokenizer)
    model.nan_at_step = 3
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    with pytest.raises(NonFiniteLogitsError, match="step 3"):
        list(backend.stream(QUESTION, DecodingOptions(max_new_tokens=10)))


def test_batch_left_padding_masks_rows_that_finished_early(tiny_tokenizer: Any) -> None:
    model = make_model(tiny_tokenizer, seed=1)
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    assert tiny_tokenizer.pad_token_id == tiny_tokenizer.eos_token_id  # padding cannot be told apart by id
    prompts = [QUESTION, "Hi", "Count from one to ten, slowly, and then stop counting"]
    prompt_lengths = [backend.count_tokens(backend.render(p)) for p in prompts]
    assert len(set(prompt_lengths)) == 3
    stop_at = max(prompt_lengths) + 4
    model.eos_at_length = stop_at  # each row stops once it holds stop_at real tokens: different steps per row
    options = DecodingOptions(max_new_tokens=stop_at)
    batch = backend.batch(prompts, options)
    singles = [backend.generate(p, options) for p in prompts]
    lengths = {len(g.tokens) for g in batch}
    assert len(lengths) == 3, f"rows should finish at different steps, got {lengths}"
    for b, s in zip(batch, singles):
        assert b.prompt_tokens + len(b.tokens) == stop_at and b.finish_reason == "stop"
        assert [t.id for t in b.tokens] == [t.id for t in s.tokens]
        assert [t.eu for t in b.tokens] == pytest.approx([t.eu for t in s.tokens], abs=1e-4)
        assert b.finish_reason == s.finish_reason
        assert b.text == s.text
    assert not any(t.id == tiny_tokenizer.eos_token_id for g in batch for t in g.tokens)


def test_dynamic_temperature_falls_as_eu_rises(tiny_backend: TransformersBackend) -> None:
    schedule = DynamicTemperature(t_max=1.2, t_min=0.2, power=1.0)
    g = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=12, dynamic=schedule, seed=0))
    assert len(g.tokens) == 12
    for t in g.tokens:
        assert t.temperature == pytest.approx(schedule.temperature(t.eu), abs=1e-5)
    by_eu = sorted(g.tokens, key=lambda t: t.eu)
    temps = [t.temperature for t in by_eu]
    assert temps == sorted(temps, reverse=True)
    again = tiny_backend.generate(QUESTION, DecodingOptions(max_new_tokens=12, dynamic=schedule, seed=0))
    assert [t.id for t in again.tokens] == [t.id for t in g.tokens]


def test_bad_inputs_have_clear_errors(tiny_tokenizer: Any, tmp_path: Path) -> None:
    model = make_model(tiny_tokenizer, max_positions=64)
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    with pytest.raises(InvalidPromptError, match="empty"):
        backend.generate("   ")
    with pytest.raises(PromptTooLongError, match="context window is 64 tokens") as info:
        backend.generate("one two three four five six seven eight nine ten " * 10)
    assert info.value.prompt_tokens > 64
    with pytest.raises(ConfigurationError, match="k=1"):
        TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, k=1)
    with pytest.raises(ConfigurationError, match=r"k=401 is larger than the model's vocabulary \(400"):
        TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, k=401)
    with pytest.raises(ModelLoadError, match="does not exist"):
        TransformersBackend(str(tmp_path / "missing-model"))
    with pytest.raises(ModelLoadError, match="nothing is downloaded"):
        TransformersBackend("some-org/not-in-the-local-cache")
    with pytest.raises(ConfigurationError, match="dtype"):
        TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, dtype="float8")
    with pytest.raises(ConfigurationError, match="non-empty list"):
        backend.batch([])


def test_prompt_plus_max_new_tokens_is_clamped_to_the_context(tiny_tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    model = make_model(tiny_tokenizer, max_positions=40)
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    g = backend.generate(QUESTION, DecodingOptions(max_new_tokens=100))
    assert g.prompt_tokens + len(g.tokens) <= 40
    assert "does not fit" in caplog.text


def test_non_finite_logits_raise(tiny_tokenizer: Any) -> None:
    model = make_model(tiny_tokenizer)
    model.nan_at_step = 0
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    with pytest.raises(NonFiniteLogitsError, match=r"non-finite top-K logits \[nan") as info:
        backend.generate(QUESTION)
    assert "float32" in str(info.value) and info.value.step == 0


def test_raw_evidence_mode_gives_nan_not_an_exception(tiny_tokenizer: Any) -> None:
    model = make_model(tiny_tokenizer, seed=5)
    model.logit_offset = -30.0  # every top logit <= -1: raw AU is undefined (NaN), EU clamps to 1
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, evidence="raw", k=2)
    g = backend.generate(QUESTION, DecodingOptions(max_new_tokens=8))
    raw_au, _ = logtoku(torch.tensor([t.top_logits for t in g.tokens], dtype=torch.float32), "raw")
    for t, a in zip(g.tokens, raw_au.tolist()):
        assert (math.isnan(t.au) and math.isnan(a)) or t.au == pytest.approx(a, abs=1e-5, nan_ok=True)
    assert any(not math.isfinite(t.au) for t in g.tokens)
    assert all(t.eu == 1.0 for t in g.tokens)  # no positive evidence at all


def test_loads_a_local_folder(tiny_tokenizer: Any, tmp_path: Path) -> None:
    model = make_model(tiny_tokenizer)
    save_plain(model, tiny_tokenizer, tmp_path)
    backend = TransformersBackend(str(tmp_path), device="cpu", dtype="float32")
    assert backend.model_name == str(tmp_path)
    ours = backend.generate(QUESTION, DecodingOptions(max_new_tokens=5))
    theirs = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer).generate(
        QUESTION, DecodingOptions(max_new_tokens=5)
    )
    assert [t.id for t in ours.tokens] == [t.id for t in theirs.tokens]


# -- incremental detokenization -----------------------------------------------------------------
def decode(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))


def whole_answer_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """The reference: each step decodes the whole answer so far and emits what is new (O(n) per step)."""
    decoded, pieces = "", []
    for n in range(1, len(ids) + 1):
        text = decode(tokenizer, ids[:n])
        if text.endswith("\ufffd"):  # an incomplete UTF-8 character: held back
            pieces.append("")
            continue
        pieces.append(text[len(decoded) :])
        decoded = text
    return pieces


def incremental_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    detokenizer = IncrementalDetokenizer()
    return [detokenizer.step(tokenizer, i) for i in ids]


MULTIBYTE = "naïve café déjà 日本語 🙂 ✓ Ωμέγα 🇫🇷 "


def test_incremental_pieces_equal_whole_answer_decoding_on_byte_level_bpe(tiny_tokenizer: Any) -> None:
    """Byte-level BPE: random ids (lone bytes give invalid or split UTF-8, special tokens are
    skipped) and real multi-byte text split across tokens; every piece equals the reference's."""
    rng = random.Random(0)
    text_ids = tiny_tokenizer(MULTIBYTE * 3, add_special_tokens=False)["input_ids"]
    assert any("\ufffd" in decode(tiny_tokenizer, [i]) for i in text_ids), "no character split across tokens"
    specials = tiny_tokenizer.all_special_ids
    held = released_after_hold = 0
    for _ in range(300):
        ids: list[int] = []
        while len(ids) < rng.randint(1, 60):
            roll = rng.random()
            if roll < 0.4:
                ids.append(rng.randrange(len(tiny_tokenizer)))
            elif roll < 0.5:
                ids.append(rng.choice(specials))
            else:
                start = rng.randrange(len(text_ids))
                ids.extend(text_ids[start : start + rng.randint(1, 8)])
        pieces = incremental_pieces(tiny_tokenizer, ids)
        assert pieces == whole_answer_pieces(tiny_tokenizer, ids), ids
        whole = decode(tiny_tokenizer, ids)
        if whole.endswith("\ufffd"):  # the answer ends inside a character: its bytes are still held
            assert whole.startswith("".join(pieces))
        else:
            assert "".join(pieces) == whole
        held += pieces.count("")
        released_after_hold += sum(1 for a, b in itertools.pairwise(pieces) if a == "" and b)
    assert held > 100 and released_after_hold > 100  # the held-back path was exercised


def test_incremental_pieces_keep_the_context_a_sentencepiece_decoder_needs() -> None:
    """Decoding a token alone would drop its leading space ("▁The" -> "The"): the window keeps
    already emitted tokens as context, so pieces still equal the whole-answer reference."""
    tok = sentencepiece_tokenizer()
    word_ids = [i for i in range(len(tok)) if i not in tok.all_special_ids and not tok.convert_ids_to_tokens(i).startswith("<0x")]
    text_ids = tok(MULTIBYTE, add_special_tokens=False)["input_ids"]
    assert any(tok.convert_ids_to_tokens(i).startswith("<0x") for i in text_ids), "no byte-fallback tokens"
    rng = random.Random(1)
    for _ in range(200):
        ids: list[int] = []
        while len(ids) < rng.randint(1, 40):
            roll = rng.random()
            if roll < 0.5:
                ids.append(rng.choice(word_ids))
            elif roll < 0.6:
                ids.append(rng.choice(tok.all_special_ids))
            else:  # whole words only: byte-fallback groups decode as a unit, split ones are not comparable
                words = tok(MULTIBYTE.split()[rng.randrange(len(MULTIBYTE.split()))], add_special_tokens=False)
                ids.extend(words["input_ids"])
        pieces = incremental_pieces(tok, ids)
        assert pieces == whole_answer_pieces(tok, ids), ids
        assert "".join(pieces) == decode(tok, ids)
    lone = [decode(tok, [i]) for i in tok("The capital of France", add_special_tokens=False)["input_ids"]]
    assert "".join(lone) != "The capital of France", "decoding tokens one by one would have been enough"


def test_runs_without_text_are_flushed_so_the_window_stays_bounded(tiny_tokenizer: Any) -> None:
    """Invalid UTF-8 (lone continuation bytes) and skipped special tokens give no complete text
    for many steps: they are flushed after MAX_PENDING tokens instead of widening the window."""
    continuation = next(i for i in range(len(tiny_tokenizer)) if tiny_tokenizer.convert_ids_to_tokens(i) == "\u0140")  # byte 0x80
    word = tiny_tokenizer("The capital", add_special_tokens=False)["input_ids"]
    ids = word + [continuation] * 100 + word + [tiny_tokenizer.eos_token_id] * 100 + word
    sizes: list[int] = []

    class Counting:
        def decode(self, ids: list[int], **kwargs: Any) -> str:
            sizes.append(len(ids))
            return str(tiny_tokenizer.decode(ids, **kwargs))

    pieces = incremental_pieces(Counting(), ids)
    assert "".join(pieces) == decode(tiny_tokenizer, ids) == "The capital" + "\ufffd" * 100 + "The capital" * 2
    assert max(sizes) <= 2 * MAX_PENDING + 2


def test_detokenization_work_per_step_does_not_grow_with_the_answer(tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids decoded per generated token stay constant from a short to a long answer (the whole-answer
    decode needed about n/2 per token: O(n^2) in all), and the answer text is unchanged."""
    model = make_model(tiny_tokenizer, max_positions=1024)
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    real_decode = tiny_tokenizer.decode
    sizes: list[int] = []

    def counting_decode(ids: list[int], *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(ids))
        return real_decode(ids, *args, **kwargs)

    monkeypatch.setattr(tiny_tokenizer, "decode", counting_decode)
    per_token = {}
    for n in (40, 400):
        model.generation_config.min_new_tokens = n  # EOS masked: exactly n tokens
        sizes.clear()
        g = backend.generate(QUESTION, DecodingOptions(max_new_tokens=n))
        assert len(g.tokens) == n
        per_token[n] = sum(sizes) / n
        assert max(sizes) <= 2 * MAX_PENDING + 2
        whole = decode(tiny_tokenizer, [t.id for t in g.tokens])
        assert g.text == whole or (whole.endswith("\ufffd") and whole.startswith(g.text))
    assert per_token[400] <= 1.5 * per_token[40] + 1, per_token


def test_is_a_complete_backend(tiny_tokenizer: Any) -> None:
    from logtoku_guard import Backend

    backend = TransformersBackend(
        "tiny", model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer, k=3, evidence="raw", top_n=4
    )
    assert isinstance(backend, Backend)
    g = backend.generate(QUESTION, DecodingOptions(max_new_tokens=2))
    assert (backend.model_name, backend.k, backend.evidence, backend.top_n) == ("tiny", 3, "raw", 4)
    assert (g.model, g.k, g.evidence, g.top_n) == ("tiny", 3, "raw", 4)


def test_the_direct_tokenizers_decode_equals_the_tokenizers_own(tiny_tokenizer: Any) -> None:
    """The detokenizer decodes a plain tokenizers-backed tokenizer with its ``tokenizers.Tokenizer``
    (fewer Python layers per step): the same text as ``decode`` for any ids, special ones included;
    a class or an instance with its own ``decode`` keeps it."""
    from logtoku_guard.backends import detokenizer

    rng = random.Random(2)
    for tok in (tiny_tokenizer, sentencepiece_tokenizer()):
        assert detokenizer._plain_tokenizers_backend(type(tok))
        for _ in range(200):
            ids = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 12))] + rng.sample(tok.all_special_ids, 1)
            rng.shuffle(ids)
            assert detokenizer.decode(tok, ids) == decode(tok, ids), ids

    class Shouting(type(tiny_tokenizer)):  # type: ignore[misc]
        def decode(self, *args: Any, **kwargs: Any) -> Any:
            return str(super().decode(*args, **kwargs)).upper()

    assert not detokenizer._plain_tokenizers_backend(Shouting)


# -- quiet by default: no transformers / torch output on load or generate ------------------------


def test_loading_and_generating_print_nothing_and_warn_nothing(
    tiny_tokenizer: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No progress bar, no logged warning and no Python warning from transformers or torch while a
    model loads and generates (generate, batch, stream, a prefix-cache hit, a repetition penalty)."""
    import warnings

    from logtoku_guard.backends.quiet import VERBOSE_ENV

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    model = make_model(tiny_tokenizer, seed=5)
    model.generation_config.repetition_penalty = 1.3
    save_plain(model, tiny_tokenizer, tmp_path)
    capfd.readouterr()  # save_pretrained's own bars are not ours
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = TransformersBackend(str(tmp_path), device="cpu")
        backend.generate(QUESTION, DecodingOptions(max_new_tokens=4))
        backend.generate(QUESTION, DecodingOptions(max_new_tokens=4))  # the prefix cache's keys passed in
        backend.batch([QUESTION, "Count from one to ten"], DecodingOptions(max_new_tokens=4))
        assert len(list(backend.stream(QUESTION, DecodingOptions(max_new_tokens=4)))) == 4
    assert backend.prefix_cache is not None and backend.prefix_cache.hits >= 1
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_verbose_lets_transformers_print_and_quiet_restores_the_users_settings(
    tiny_tokenizer: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    from transformers.utils import logging as hf_logging

    from logtoku_guard.backends.quiet import VERBOSE_ENV

    save_plain(make_model(tiny_tokenizer), tiny_tokenizer, tmp_path)
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    hf_logger = logging.getLogger("transformers")
    level, bars = hf_logger.level, hf_logging.is_progress_bar_enabled()
    try:
        hf_logger.setLevel(logging.INFO)  # the user's own choice: kept after a quiet load
        hf_logging.enable_progress_bar()
        capfd.readouterr()
        TransformersBackend(str(tmp_path), device="cpu")
        assert "Loading weights" not in capfd.readouterr().err
        assert hf_logger.level == logging.INFO and hf_logging.is_progress_bar_enabled()

        TransformersBackend(str(tmp_path), device="cpu", verbose=True)
        assert "Loading weights" in capfd.readouterr().err
        monkeypatch.setenv(VERBOSE_ENV, "1")
        TransformersBackend(str(tmp_path), device="cpu")
        assert "Loading weights" in capfd.readouterr().err
    finally:
        hf_logger.setLevel(level)
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()

    monkeypatch.setenv(VERBOSE_ENV, "loud")
    with pytest.raises(ConfigurationError, match=r"LOGTOKU_GUARD_VERBOSE must be 1 .* got 'loud'"):
        TransformersBackend(str(tmp_path), device="cpu")
    monkeypatch.delenv(VERBOSE_ENV)
    with pytest.raises(ConfigurationError, match=r"verbose must be True, False or None .* got 'yes'"):
        TransformersBackend(str(tmp_path), device="cpu", verbose="yes")  # type: ignore[arg-type]


def test_nested_and_concurrent_quiet_blocks_restore_the_setting_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first block in saves transformers' logger level, the last one out restores it, whichever thread."""
    import logging

    from logtoku_guard.backends.quiet import VERBOSE_ENV, quiet_transformers

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    hf_logger = logging.getLogger("transformers")
    before = hf_logger.level
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with quiet_transformers():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    with quiet_transformers():
        thread.start()
        assert inside.wait(10)
        with quiet_transformers(gguf=True):
            assert hf_logger.level == logging.ERROR
    assert hf_logger.level == logging.ERROR  # the other thread's block is still open
    release.set()
    thread.join(10)
    assert hf_logger.level == before


def test_the_cache_goes_under_the_name_the_forward_takes() -> None:
    """``cache`` (transformers >= 5.24) or ``past_key_values`` (5.0-5.23), read from the forward's
    signature; a forward taking only ``**kwargs`` gets the installed transformers' name."""
    import dataclasses

    from transformers.modeling_outputs import BaseModelOutputWithPast

    from logtoku_guard.backends.hf_compat import cache_arg, returned_cache

    class New:
        def forward(self, input_ids: Any = None, cache: Any = None) -> None: ...

    class Old:
        def forward(self, input_ids: Any = None, past_key_values: Any = None) -> None: ...

    class Passing:
        def forward(self, input_ids: Any = None, **kwargs: Any) -> None: ...

    installed = "cache" if "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)} else "past_key_values"
    assert (cache_arg(New()), cache_arg(Old()), cache_arg(Passing())) == ("cache", "past_key_values", installed)
    marker = object()
    assert returned_cache(BaseModelOutputWithPast(**{installed: marker})) is marker
