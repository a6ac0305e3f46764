"""ScriptedBackend: replays scripted top-K logits through the real maths, like a real backend."""

from __future__ import annotations

import math

import pytest
import torch

from logtoku_guard import Backend, ScriptedAnswer, ScriptedBackend
from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation
from logtoku_guard.uncertainty import logtoku

PARIS = ScriptedAnswer(
    pieces=["The", " capital", " is", " Par", "is", ".", "\n", "Next"],
    top_logits=[
        [30, 20, 10, 5, 1],
        [1, 3, 0.5, 0.2, 0.1],  # unsorted on purpose
        [10, 10, 0, -1, -2],
        [5, -3, -4, -5, -6],
        [0.5, -0.5, -1, -2, -3],
        [12, 2, 1, 0, -1],
        [8, 7, 6, 5, 4],
        [2, 2, 2, 2, 2],
    ],
)
SHORT = ScriptedAnswer(pieces=["Yes", "."], top_logits=[[9.0, 1.0, 0.0], [4.0, 3.5, -2.0]])


def expected_au_eu(rows: list[list[float]], k: int, evidence: str = "clamped") -> tuple[list[float], list[float]]:
    top = torch.tensor([sorted(r, reverse=True)[:k] for r in rows], dtype=torch.float64)
    au, eu = logtoku(top, evidence)  # type: ignore[arg-type]
    return au.tolist(), eu.tolist()


def assert_floats(actual: list[float], expected: list[float]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if math.isnan(e):
            assert math.isnan(a)
        else:
            assert a == pytest.approx(e, abs=1e-12)


def test_is_a_backend() -> None:
    backend = ScriptedBackend([PARIS], model_name="fake-1")
    assert isinstance(backend, Backend)
    assert backend.model_name == "fake-1" and backend.k == 2


def test_generate_replays_text_and_metadata() -> None:
    backend = ScriptedBackend([PARIS], top_n=3)
    gen = backend.generate("What is the capital of France?")
    assert isinstance(gen, Generation)
    assert gen.text == "The capital is Paris.\nNext"
    assert [t.text for t in gen.tokens] == list(PARIS.pieces)
    assert [t.index for t in gen.tokens] == list(range(8))
    assert gen.finish_reason == "stop" and gen.stop_sequence is None
    assert gen.model == "scripted" and gen.prompt == "What is the capital of France?"
    assert (gen.k, gen.evidence, gen.top_n) == (2, "clamped", 3)
    assert backend.calls == [[ChatMessage("user", "What is the capital of France?")]]


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("evidence", ["clamped", "raw"])
def test_au_eu_equal_the_maths(k: int, evidence: str) -> None:
    backend = ScriptedBackend([PARIS], k=k, evidence=evidence)  # type: ignore[arg-type]
    gen = backend.generate("q")
    au, eu = expected_au_eu([list(map(float, r)) for r in PARIS.top_logits], k, evidence)
    assert_floats([t.au for t in gen.tokens], au)
    assert_floats([t.eu for t in gen.tokens], eu)
    for t, row in zip(gen.tokens, PARIS.top_logits):
        assert list(t.top_logits) == sorted(map(float, row), reverse=True)[:k]
        assert len(t.top_ids) == k


def test_spec_vectors_through_the_backend() -> None:
    gen = ScriptedBackend([PARIS]).generate("q")
    assert [round(t.au, 6) for t in gen.tokens[:5]] == [0.663117, 0.458333, 0.668771, 0.0, 0.0]
    assert [round(t.eu, 6) for t in gen.tokens[:5]] == [0.038462, 0.333333, 0.090909, 0.285714, 0.8]
    raw = ScriptedBackend([PARIS], evidence="raw").generate("q")
    assert math.isnan(raw.tokens[3].au) and raw.tokens[4].au == -math.inf


def test_logprob_and_entropy_from_scripted_row() -> None:
    gen = ScriptedBackend([SHORT]).generate("q")
    for t, row in zip(gen.tokens, SHORT.top_logits):
        lp = torch.log_softmax(torch.tensor(row, dtype=torch.float64), -1)
        assert t.logprob == pytest.approx(float(lp.max()))
        assert t.entropy == pytest.approx(float(-(lp.exp() * lp).sum()))


def test_batch_replays_in_order() -> None:
    backend = ScriptedBackend([SHORT, PARIS])
    gens = backend.batch(["first", [{"role": "user", "content": "second"}]])
    assert [g.text for g in gens] == ["Yes.", "The capital is Paris.\nNext"]
    assert [g.prompt for g in gens] == ["first", "second"]
    assert len(backend.calls) == 2


def test_stream_replays_tokens_then_generation() -> None:
    backend = ScriptedBackend([PARIS])
    stream = backend.stream("q")
    with pytest.raises(LogTokUError, match="not finished"):
        _ = stream.generation
    seen = list(stream)
    assert [t.text for t in seen] == list(PARIS.pieces)
    gen = stream.generation
    assert gen.finish_reason == "stop"
    assert gen.tokens == tuple(seen)
    ref = ScriptedBackend([PARIS]).generate("q")
    assert [(t.au, t.eu) for t in seen] == [(t.au, t.eu) for t in ref.tokens]


def test_stream_closed_early_is_cancelled_with_tokens_so_far() -> None:
    backend = ScriptedBackend([PARIS])
    with backend.stream("q") as stream:
        seen = []
        for t in stream:
            seen.append(t)
            if len(seen) == 3:
                break
    gen = stream.generation
    assert gen.finish_reason == "cancelled"
    assert [t.text for t in gen.tokens] == ["The", " capital", " is"]
    assert gen.text == "The capital is"
    assert gen.tokens == tuple(seen)
    assert list(stream) == []  # nothing more after close


def test_stream_close_before_iterating() -> None:
    stream = ScriptedBackend([PARIS]).stream("q")
    stream.close()
    gen = stream.generation
    assert gen.finish_reason == "cancelled" and gen.tokens == () and gen.text == ""


def test_stream_fully_consumed_then_closed_is_not_cancelled() -> None:
    with ScriptedBackend([SHORT]).stream("q") as stream:
        assert len(list(stream)) == 2
    assert stream.generation.finish_reason == "stop"


def test_stop_string_cuts_text_and_tokens() -> None:
    gen = ScriptedBackend([PARIS]).generate("q", DecodingOptions(stop="\n"))
    assert gen.text == "The capital is Paris."
    assert [t.text for t in gen.tokens] == ["The", " capital", " is", " Par", "is", "."]
    assert gen.finish_reason == "stop" and gen.stop_sequence == "\n"


def test_stop_string_inside_a_token_truncates_it() -> None:
    gen = ScriptedBackend([PARIS]).generate("q", DecodingOptions(stop=["is.", "zzz"]))
    # "is." first occurs across tokens "is" + "." of "Paris.": cut on a token boundary
    assert gen.text == "The capital is Par"
    assert [t.text for t in gen.tokens] == ["The", " capital", " is", " Par"]
    gen2 = ScriptedBackend([PARIS]).generate("q", DecodingOptions(stop="apital"))
    assert gen2.text == "The c"
    assert [t.text for t in gen2.tokens] == ["The", " c"]
    assert gen2.tokens[1].au == pytest.approx(0.458333, abs=1e-6)  # scores kept for the cut token
    assert gen2.stop_sequence == "apital"


def test_earliest_stop_string_wins() -> None:
    gen = ScriptedBackend([PARIS]).generate("q", DecodingOptions(stop=("Next", " is")))
    assert gen.text == "The capital"
    assert gen.stop_sequence == " is"


def test_max_new_tokens_gives_length() -> None:
    gen = ScriptedBackend([PARIS]).generate("q", DecodingOptions(max_new_tokens=4))
    assert gen.finish_reason == "length"
    assert gen.text == "The capital is Par"
    assert len(gen.tokens) == 4
    exact = ScriptedBackend([PARIS]).generate("q", DecodingOptions(max_new_tokens=8))
    assert exact.finish_reason == "stop" and len(exact.tokens) == 8


def test_stop_within_length_limit_is_stop() -> None:
    gen = ScriptedBackend([PARIS]).generate("q", DecodingOptions(max_new_tokens=7, stop="."))
    assert gen.finish_reason == "stop" and gen.text == "The capital is Paris"
    after = ScriptedBackend([PARIS]).generate("q", DecodingOptions(max_new_tokens=3, stop="Next"))
    assert after.finish_reason == "length" and after.stop_sequence is None


def test_stream_respects_options() -> None:
    stream = ScriptedBackend([PARIS]).stream("q", DecodingOptions(stop="\n"))
    assert "".join(t.text for t in stream) == "The capital is Paris."
    assert stream.generation.finish_reason == "stop"


def test_callable_script() -> None:
    def script(messages: list[ChatMessage]) -> ScriptedAnswer:
        question = messages[-1].content
        return SHORT if "yes" in question else PARIS

    backend = ScriptedBackend(script)
    assert backend.generate("say yes").text == "Yes."
    assert backend.generate("capital?").text.startswith("The capital")
    assert backend.generate("yes again").text == "Yes."  # never runs out
    assert [c[-1].content for c in backend.calls] == ["say yes", "capital?", "yes again"]


def test_running_out_of_answers() -> None:
    backend = ScriptedBackend([SHORT])
    backend.generate("one")
    with pytest.raises(LogTokUError, match="ran out of answers after 1 calls"):
        backend.generate("two")
    with pytest.raises(LogTokUError, match="ran out"):
        ScriptedBackend([]).batch(["x"])


def test_system_prompt_and_invalid_prompt() -> None:
    backend = ScriptedBackend([SHORT])
    gen = backend.generate([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert gen.prompt == "U"
    with pytest.raises(ConfigurationError):
        backend.generate("  ")


def test_empty_answer() -> None:
    gen = ScriptedBackend([ScriptedAnswer(pieces=[], top_logits=[])]).generate("q")
    assert gen.text == "" and gen.tokens == () and math.isnan(gen.reliability)


def test_script_validation() -> None:
    with pytest.raises(ConfigurationError, match="2 pieces and 1 rows"):
        ScriptedAnswer(pieces=["a", "b"], top_logits=[[1.0, 2.0]])
    with pytest.raises(ConfigurationError, match="k=1"):
        ScriptedBackend([SHORT], k=1)
    with pytest.raises(ConfigurationError, match="top_n"):
        ScriptedBackend([SHORT], top_n=0)
    with pytest.raises(ConfigurationError, match="k=4"):
        ScriptedBackend([SHORT], k=4).generate("q")  # rows hold 3 logits


def test_reliability_of_scripted_answer() -> None:
    gen = ScriptedBackend([SHORT], top_n=1).generate("q")
    u = [t.au * t.eu for t in gen.tokens]
    assert gen.reliability == pytest.approx(-max(u))
    assert gen.score.reliability_mean == pytest.approx(-sum(u) / 2)
