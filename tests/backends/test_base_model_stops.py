"""A base model stops where its answer ends (issue 44 item 6), on a tiny random model.

A packaged base model's record carries its stop strings (``PackagedModel.stop``; Gemma 3 270M: a
blank line); the local backends add them to every row of that model's file beside the caller's
``stop``. The model's stops are looked for after the answer's leading whitespace (a base model opens
its answer with a blank line), the caller's from the first character (OpenAI's ``stop``); the
earliest match of either ends the answer, and the tokens after it are dropped with their scores.

The tiny model is forced to open its answer with two newlines, as Gemma does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from support.tiny import make_model, make_tokenizer, save_plain

from logtoku_guard.backends import packaged_models
from logtoku_guard.backends.packaged_models import PACKAGED_MODELS, PackagedModel, packaged_stop
from logtoku_guard.backends.stop_strings import held_stop, search_start
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.errors import ModelLoadError
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.types import DecodingOptions, TokenScore

QUESTION = "What is the capital of France?"
GREEDY = DecodingOptions(max_new_tokens=24)


def token(text: str, i: int = 0) -> TokenScore:
    return TokenScore(
        index=i, id=i, text=text, top_logits=(1.0, 0.0), top_ids=(i, i + 1), au=0.1, eu=0.2, logprob=-0.5, entropy=0.7
    )


def tokens(*texts: str) -> list[TokenScore]:
    return [token(t, i) for i, t in enumerate(texts)]


def same_tokens(got: Any, want: Any) -> bool:
    """Same ids, texts and scores (to float rounding: a prefix-cached prefill may differ in the last bits)."""
    return [(t.id, t.text) for t in got] == [(t.id, t.text) for t in want] and all(
        (a.au, a.eu, a.logprob) == pytest.approx((b.au, b.eu, b.logprob), rel=1e-4, abs=1e-6) for a, b in zip(got, want)
    )


# -- the stop-string functions -----------------------------------------------------------------------


def test_a_model_stop_is_looked_for_after_the_answers_leading_whitespace() -> None:
    held = tokens("\n\n", "Paris", ".", "\n\n", "What")
    kept, seq, n = held_stop([], held, (), ("\n\n",))
    assert [t.text for t in kept] == ["\n\n", "Paris", "."] and seq == "\n\n" and n == 0
    # The caller's own "\n\n" is looked for from the first character (OpenAI's stop): an empty answer.
    kept, seq, _ = held_stop([], held, ("\n\n",), ())
    assert kept == [] and seq == "\n\n"
    # Both: the earliest match wins, the caller's at 0.
    assert held_stop([], held, ("\n\n",), ("\n\n",))[:2] == ([], "\n\n")
    # A caller's stop before the model's cuts shorter; one after it does not make the answer longer.
    assert [t.text for t in held_stop([], held, ("Par",), ("\n\n",))[0]] == ["\n\n"]
    assert [t.text for t in held_stop([], held, ("What",), ("\n\n",))[0]] == ["\n\n", "Paris", "."]


def test_the_leading_whitespace_may_span_released_tokens_and_a_token_across_it() -> None:
    # Released so far: only whitespace; the held text goes on with whitespace then the answer.
    assert search_start(tokens("\n"), tokens("\n", " Paris")) == 2
    assert search_start(tokens("\n", "Paris"), tokens("\n\n")) == 0  # the answer has begun: a blank line stops it
    assert search_start([], tokens("\n", "\n")) == 2  # all whitespace so far: no model stop can begin yet
    kept, seq, n = held_stop(tokens("\n", "Paris"), tokens("\n\n", "x"), (), ("\n\n",))
    assert kept == [] and seq == "\n\n" and n == 0


def test_held_back_text_is_what_could_still_begin_a_stop() -> None:
    # "\n" at the end could begin the model's "\n\n" once the answer has begun: held back.
    assert held_stop([], tokens("\n\n", "Paris", "\n"), (), ("\n\n",)) == (tokens("\n\n", "Paris", "\n"), None, 2)
    # Leading whitespace can never begin a model stop: released at once.
    assert held_stop([], tokens("\n", "\n"), (), ("\n\n",))[2] == 2
    # ... but it can begin the caller's.
    assert held_stop([], tokens("\n"), ("\n\n",), ("\n\n",))[2] == 0


# -- the record --------------------------------------------------------------------------------------


def test_the_gemma_record_carries_a_blank_line_stop_found_by_its_file_name() -> None:
    gemma = PACKAGED_MODELS["gemma3-270m"]
    assert gemma.stop == ("\n\n",) and gemma.file == "gemma-3-270m-q4_k_m.gguf"
    assert packaged_stop(Path("/anywhere") / gemma.file) == ("\n\n",)
    assert packaged_stop("SmolLM2-135M-Instruct.Q4_1.gguf") == () and packaged_stop("smollm2-135m-instruct") == ()


def test_a_package_shipping_another_file_than_its_record_names_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    module = types.ModuleType("renamed_gguf_pkg")
    module.MODEL_NAME = "renamed.gguf"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "renamed_gguf_pkg", module)
    monkeypatch.setattr(packaged_models.importlib.util, "find_spec", lambda name: object())
    record = PackagedModel("renamed_gguf_pkg", "renamed-gguf", "renamed", "test", file="old.gguf", stop=("\n\n",))
    monkeypatch.setitem(PACKAGED_MODELS, "renamed-1b", record)
    with pytest.raises(ModelLoadError, match=r"ships 'renamed.gguf', not the 'old.gguf'.*logtoku-guard\[renamed\]"):
        packaged_models.packaged_gguf_path("renamed-1b")


# -- on a real (tiny) decode loop --------------------------------------------------------------------


def opens_with_blank_line(model: Any, newline_id: int) -> Any:
    """``model`` made to choose ``newline_id`` for its first two answer tokens, as a base model opens with a blank line."""
    forward = model.forward
    calls = {"n": 0}

    def forced(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        if calls["n"] < 2:
            out.logits[:, -1, newline_id] = 60.0
        calls["n"] += 1
        return out

    model.forward = forced
    return calls


@pytest.fixture
def base_backend() -> tuple[TransformersBackend, dict[str, int]]:
    tok = make_tokenizer()
    model = make_model(tok, seed=3)
    calls = opens_with_blank_line(model, tok.convert_tokens_to_ids("Ċ"))  # byte-level BPE's "\n"
    return TransformersBackend("tiny-base", model_obj=model, tokenizer=tok), calls


def fresh(backend_calls: tuple[TransformersBackend, dict[str, int]], model_stop: tuple[str, ...]) -> TransformersBackend:
    backend, calls = backend_calls
    calls["n"] = 0  # each generation opens with its blank line
    backend.model_stop = model_stop
    return backend


def test_the_model_stop_ends_the_answer_after_its_blank_line_and_scores_only_the_kept_tokens(base_backend: Any) -> None:
    full = fresh(base_backend, ()).generate(QUESTION, GREEDY)
    assert full.text.startswith("\n\n") and full.finish_reason == "length" and len(full.tokens) == 24
    rest = full.text[2:]
    assert rest.strip() and "\n\n" not in rest
    # A blank-line stop that only the leading whitespace holds does not end the answer.
    assert fresh(base_backend, ("\n\n",)).generate(QUESTION, GREEDY).text == full.text
    # A model stop made of tokens 6 and 7 (a token boundary): the answer is tokens 0-5, with their own scores.
    stop = full.tokens[6].text + full.tokens[7].text
    assert stop.strip() and full.text.find(stop) == sum(len(t.text) for t in full.tokens[:6])
    g = fresh(base_backend, ("\n", stop)).generate(QUESTION, GREEDY)  # "\n" too: only after the leading whitespace
    assert g.finish_reason == "stop" and g.stop_sequence == stop
    assert same_tokens(g.tokens, full.tokens[:6]) and g.text == "".join(t.text for t in full.tokens[:6])
    # The answer's statistics are those of the kept tokens alone.
    kept = ResponseStats.from_generation(dataclasses.replace(full, text=g.text, tokens=full.tokens[:6]))
    whole = ResponseStats.from_generation(full)
    got = ResponseStats.from_generation(g)
    assert got.n_tokens == kept.n_tokens == 6 and whole.n_tokens == 24
    assert (got.max_eu, got.mean_eu, got.reliability) == pytest.approx((kept.max_eu, kept.mean_eu, kept.reliability), rel=1e-4)
    assert (got.mean_eu, got.reliability) != pytest.approx((whole.mean_eu, whole.reliability), rel=1e-4)
    # Streamed: the same tokens, none of the cut ones.
    with fresh(base_backend, (stop,)).stream(QUESTION, GREEDY) as s:
        streamed = list(s)
    assert same_tokens(streamed, full.tokens[:6]) and same_tokens(s.generation.tokens, full.tokens[:6])


def test_the_callers_stop_joins_the_models_and_the_earliest_wins(base_backend: Any) -> None:
    full = fresh(base_backend, ()).generate(QUESTION, GREEDY)
    late = full.tokens[10].text + full.tokens[11].text
    early = full.tokens[4].text + full.tokens[5].text
    assert late.strip() and early.strip() and full.text.find(early) < full.text.find(late)
    # The model's stop comes first: a caller's later stop does not make the answer run on.
    g = fresh(base_backend, (early,)).generate(QUESTION, GREEDY.replace(stop=(late,)))
    assert g.stop_sequence == early and same_tokens(g.tokens, full.tokens[:4])
    # The caller's comes first: it cuts shorter.
    g = fresh(base_backend, (late,)).generate(QUESTION, GREEDY.replace(stop=(early,)))
    assert g.stop_sequence == early and same_tokens(g.tokens, full.tokens[:4])
    # The caller's stop is OpenAI's: looked for from the first character, so a leading "\n" ends it empty.
    g = fresh(base_backend, (late,)).generate(QUESTION, GREEDY.replace(stop=("\n",)))
    assert g.text == "" and g.tokens == () and g.stop_sequence == "\n"
    # model_stop = (): the whole continuation (a caller who wants it).
    assert same_tokens(fresh(base_backend, ()).generate(QUESTION, GREEDY).tokens, full.tokens)


def test_the_transformers_backend_takes_the_records_stops_for_the_packaged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend running the file a record names adds the record's stops to every row (and no other file's)."""
    tok = make_tokenizer()
    folder = tmp_path / "tiny-base-1b"
    save_plain(make_model(tok, seed=3), tok, folder)
    plain = TransformersBackend(str(folder))
    assert plain.model_stop == ()
    full = plain.generate(QUESTION, GREEDY)
    stop = full.tokens[5].text + full.tokens[6].text
    assert stop.strip() and full.text.find(stop) == sum(len(t.text) for t in full.tokens[:5])
    monkeypatch.setitem(PACKAGED_MODELS, "tiny-base-1b", PackagedModel("m", "d", "e", "l", file=folder.name, stop=(stop,)))
    recorded = TransformersBackend(str(folder))
    assert recorded.model_stop == (stop,)
    g = recorded.generate(QUESTION, GREEDY)
    assert g.stop_sequence == stop and same_tokens(g.tokens, full.tokens[:5]) and g.finish_reason == "stop"
    assert all(same_tokens(b.tokens, full.tokens[:5]) for b in recorded.batch([QUESTION, QUESTION], GREEDY))
