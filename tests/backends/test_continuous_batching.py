"""Continuous batching in TransformersBackend: rows join a running batch between steps and leave it as they end.

Every request that joins or shares a running batch must give the tokens and AU/EU of the
same request alone (1e-4). Joins are made deterministic by holding the worker inside a
forward pass (:class:`support.gate.Gate`) while the joiners queue.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.gate import Forwards, Gate
from support.joins import gated, join_mid_generation, queued
from support.same import assert_same, wait_until

from logtoku_guard import DynamicTemperature, NonFiniteLogitsError
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.types import DecodingOptions, to_messages

RUNNING = "Count from one to ten, slowly, and then stop counting"
LONG = "Retrieval augmented generation adds context before answering a question. " * 3


def prompt_tokens(backend: Any, text: str) -> int:
    """Tokens of ``text``'s prompt as the backend feeds it (chat template applied)."""
    return len(backend._prepare(to_messages(text), DecodingOptions()).ids)


@pytest.mark.parametrize("ending", ["length and stop strings", "eos"])
def test_requests_joining_mid_generation_equal_their_solo_runs(tiny_tokenizer: Any, ending: str) -> None:
    """A shorter and a longer prompt join a running row: each side of the merge gets padded."""
    backend, gate, model = gated(tiny_tokenizer)
    lengths = [prompt_tokens(backend, p) for p in (RUNNING, "Hi", LONG)]
    assert lengths[1] < lengths[0] + 3 < lengths[2]
    if ending == "eos":  # every row ends by EOS once it holds this many tokens: at different steps
        model.eos_at_length = max(lengths) + 5
        options = [DecodingOptions(max_new_tokens=200)] * 3
    else:
        options = [DecodingOptions(max_new_tokens=30), DecodingOptions(max_new_tokens=12), DecodingOptions(max_new_tokens=15)]
        options[2] = options[2].replace(stop=("e",))
    requests = list(zip((RUNNING, "Hi", LONG), options))
    alone = [backend.generate(p, o) for p, o in requests]
    together = join_mid_generation(backend, gate, requests[0], requests[1:])
    for a, b in zip(alone, together):
        assert_same(a, b)
    if ending == "eos":
        assert all(g.finish_reason == "stop" and g.prompt_tokens + len(g.tokens) == max(lengths) + 5 for g in together)
    assert all(g.prompt_scores for g in together)


def test_rows_leave_and_the_padding_they_leave_is_cut(tiny_tokenizer: Any) -> None:
    backend, gate, _ = gated(tiny_tokenizer)
    forwards = Forwards(backend.model)
    requests = [(RUNNING, DecodingOptions(max_new_tokens=40)), (LONG, DecodingOptions(max_new_tokens=4))]
    alone = [backend.generate(p, o) for p, o in requests]
    mark = len(forwards.seen)
    together = join_mid_generation(backend, gate, requests[0], requests[1:])
    for a, b in zip(alone, together):
        assert_same(a, b)
    steps = [f for f in forwards.seen[mark:] if f.new == 1]
    assert max(f.rows for f in steps) == 2 and steps[-1].rows == 1 and steps[-1].cached_rows == 1
    # once the longer (joined) row has left, the columns only its prompt needed are cut off: the
    # running row's mask is as wide as its own tokens again
    assert steps[-1].width == prompt_tokens(backend, RUNNING) + len(together[0].tokens) - 1


@pytest.mark.parametrize("failure", ["non-finite logits", "prefill error"])
def test_a_joiner_that_fails_does_not_stop_the_running_rows(tiny_tokenizer: Any, failure: str) -> None:
    backend, gate, model = gated(tiny_tokenizer)
    running = (RUNNING, DecodingOptions(max_new_tokens=20))
    alone = backend.generate(*running)
    poison = threading.Event()

    def hook(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if poison.is_set() and kwargs["input_ids"].shape[1] > 1:  # the joiner's prefill
            poison.clear()
            if failure == "prefill error":
                raise RuntimeError("the prefill failed")
            output.logits[:, -1, 5] = float("nan")

    model.register_forward_hook(hook, with_kwargs=True)
    stream = backend.stream(*running)
    tokens = iter(stream)
    next(tokens)
    with ThreadPoolExecutor(1) as pool:
        with gate.held():
            poison.set()
            bad = pool.submit(backend.generate, "Hi", DecodingOptions(max_new_tokens=10))
            wait_until(lambda: queued(backend) == 1, "the joiner to queue")
        error = NonFiniteLogitsError if failure == "non-finite logits" else RuntimeError
        with pytest.raises(error, match=r"step 0|prefill failed"):
            bad.result(60)
    list(tokens)
    assert_same(alone, stream.generation)


def test_the_models_own_logits_processors_see_each_rows_own_tokens(tiny_tokenizer: Any) -> None:
    """Repetition penalty and ``min_new_tokens`` from the model's generation config, as generate()
    builds them, run per row on its own tokens: a joined row counts its own new tokens."""
    backend, gate, model = gated(tiny_tokenizer, seed=3)
    model.generation_config.repetition_penalty = 1.8
    model.generation_config.min_new_tokens = 6
    model.eos_at_length = 1  # the raw logits always favour EOS: only min_new_tokens holds it off
    requests = [(p, DecodingOptions(max_new_tokens=20)) for p in (RUNNING, "Hi", LONG)]
    alone = [backend.generate(p, o) for p, o in requests]
    assert all(len(g.tokens) == 6 and g.finish_reason == "stop" for g in alone)
    together = join_mid_generation(backend, gate, requests[0], requests[1:])
    for a, b in zip(alone, together):
        assert_same(a, b)
    batched = backend.batch([p for p, _ in requests], DecodingOptions(max_new_tokens=20))
    for a, b in zip(alone, batched):
        assert_same(a, b)


def test_rows_stay_within_the_context_window_whatever_joins(tiny_tokenizer: Any) -> None:
    backend, gate, _ = gated(tiny_tokenizer, max_positions=48)
    forwards = Forwards(backend.model)
    requests = [(RUNNING, DecodingOptions(max_new_tokens=100)), ("Hi", DecodingOptions(max_new_tokens=100))]
    alone = [backend.generate(p, o) for p, o in requests]
    together = join_mid_generation(backend, gate, requests[0], requests[1:])
    for a, b in zip(alone, together):
        assert_same(a, b)
        assert b.prompt_tokens + len(b.tokens) <= 48
    assert max(f.width for f in forwards.seen) <= 48


def test_sampled_rows_share_a_batch_with_their_own_dynamic_temperatures(tiny_tokenizer: Any) -> None:
    backend, gate, model = gated(tiny_tokenizer)
    model.generation_config.min_new_tokens = 12  # no sampled EOS: every row runs its 12 tokens
    schedule = DynamicTemperature(t_max=1.2, t_min=0.2, power=1.0)
    options = DecodingOptions(max_new_tokens=12, dynamic=schedule)
    together = join_mid_generation(backend, gate, (RUNNING, options), [("Hi", options), (LONG, options)])
    for g in together:
        assert len(g.tokens) == 12
        for t in g.tokens:
            assert t.temperature == pytest.approx(schedule.temperature(t.eu), abs=1e-5)


def test_the_running_batch_merges_and_cuts_whole_columns() -> None:
    import torch
    from transformers import DynamicCache

    from logtoku_guard.backends.kv_batch import KVBatch

    def cache(keys: torch.Tensor) -> Any:
        c = DynamicCache()
        c.update(keys, keys + 100, 0)
        return c

    torch.manual_seed(0)
    a_keys, b_keys = torch.randn(1, 2, 3, 4), torch.randn(2, 2, 2, 4)
    batch = KVBatch()
    batch.extend(torch.tensor([[1, 1, 1]]), cache(a_keys))
    batch.extend(torch.tensor([[0, 1], [1, 1]]), cache(b_keys))
    assert batch.mask is not None and batch.mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    layer = batch.cache.layers[0]
    assert torch.equal(layer.keys[0], a_keys[0]) and torch.equal(layer.keys[1:, :, 1:], b_keys)
    assert torch.equal(layer.values[0], a_keys[0] + 100) and torch.equal(layer.values[1:, :, 1:], b_keys + 100)
    assert not layer.keys[1:, :, 0].any() and not layer.values[1:, :, 0].any()  # the padding: zeros
    batch.last = torch.tensor([7, 8, 9])
    batch.keep([2, 1])  # the first row leaves: its column 0 held no one else's token
    assert batch.mask.tolist() == [[1, 1], [0, 1]] and batch.last.tolist() == [9, 8]
    assert torch.equal(batch.cache.layers[0].keys, b_keys.flip(0)) and len(batch) == 2
    batch.keep([])
    assert len(batch) == 0 and batch.cache is None


@pytest.mark.slow
def test_the_interpreter_exits_cleanly_while_a_batch_runs() -> None:
    """At exit the worker leaves the model first (the batcher's atexit hook), even mid-generation with joined rows."""
    tests = Path(__file__).resolve().parents[1]
    code = (
        f"import sys, threading; sys.path.insert(0, {str(tests)!r})\n"
        "from support.tiny import make_model, make_tokenizer\n"
        "from logtoku_guard.backends.transformers import TransformersBackend\n"
        "from logtoku_guard.types import DecodingOptions\n"
        "tok = make_tokenizer()\n"
        "b = TransformersBackend('tiny', model_obj=make_model(tok, max_positions=1024), tokenizer=tok)\n"
        "s = b.stream('hello', DecodingOptions(max_new_tokens=600))\n"
        "it = iter(s); next(it)\n"
        "threading.Thread(target=b.generate, args=('Hi', DecodingOptions(max_new_tokens=600)), daemon=True).start()\n"
        "import time\n"
        "deadline = time.monotonic() + 30\n"
        "while b._batcher.joins < 1 and time.monotonic() < deadline: time.sleep(0.001)\n"
        "print('exiting', b._batcher.joins, flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["exiting", "1"] and "terminate called" not in done.stderr


@pytest.mark.slow
def test_embedded_model_answers_equal_generate_and_survive_joins(embedded_backend: Any) -> None:
    """The real model: our decode loop gives generate()'s greedy tokens, and joined rows equal their solo runs."""
    import torch

    backend: TransformersBackend = embedded_backend
    questions = ["What is the capital of France?", "Name three primary colours.", "Who wrote Hamlet?"]
    options = DecodingOptions(max_new_tokens=24)
    alone = [backend.generate(q, options) for q in questions]
    enc = backend.tokenizer(backend.render(questions[0]), return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        ref = backend.model.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=backend.tokenizer.pad_token_id)
    assert [t.id for t in alone[0].tokens] == ref[0, enc["input_ids"].shape[1] :].tolist()[: len(alone[0].tokens)]
    gate = Gate(backend.model)
    try:
        together = join_mid_generation(backend, gate, (questions[0], options), [(q, options) for q in questions[1:]])
    finally:
        gate.handle.remove()
    for a, b in zip(alone, together):
        assert_same(a, b)
