"""ScriptedBackend: replays scripted top-K logits through the real maths, like a real backend."""

from __future__ import annotations

import math

import pytest
import torch

from logtoku_guard import Backend, ScriptedAnswer, ScriptedBackend
from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.scoring.uncertainty import logtoku
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation

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


PROTOCOL_PROPERTIES = sorted(n for n, v in vars(Backend).items() if isinstance(v, property))


def test_protocol_properties_are_the_four_scoring_settings() -> None:
    assert PROTOCOL_PROPERTIES == ["evidence", "k", "model_name", "top_n"]


def test_is_a_backend() -> None:
    backend = ScriptedBackend([PARIS], model_name="fake-1")
    assert isinstance(backend, Backend)
    assert backend.model_name == "fake-1" and backend.k == 2
    assert (backend.evidence, backend.top_n) == ("clamped", 25)


@pytest.mark.parametrize("evidence", ["clamped", "raw"])
def test_properties_equal_the_fields_of_every_generation(evidence: str) -> None:
    backend = ScriptedBackend([PARIS], k=3, evidence=evidence, top_n=4, model_name="fake-2")  # type: ignore[arg-type]
    gen = backend.generate("q")
    settings = {name: getattr(backend, name) for name in PROTOCOL_PROPERTIES}
    assert settings == {"evidence": evidence, "k": 3, "model_name": "fake-2", "top_n": 4}
    assert {"evidence": gen.evidence, "k": gen.k, "model_name": gen.model, "top_n": gen.top_n} == settings


def test_evidence_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="evidence"):
        ScriptedBackend([PARIS], evidence="clipped")  # type: ignore[arg-type]


def test_raw_evidence_everywhere() -> None:
    """evidence="raw" in generate, stream and batch: the spec's NaN / -inf AU (section 8 rows 4
    and 5: AU raw NaN and -inf, EU clamped), NaN reliability, and every Generation says "raw"."""
    backend = ScriptedBackend([PARIS] * 4, evidence="raw")
    streamed = backend.stream("q")
    list(streamed)
    gens = [backend.generate("q"), streamed.generation, *backend.batch(["q", "q"])]
    for gen in gens:
        assert gen.evidence == "raw"
        au = [t.au for t in gen.tokens[:5]]
        assert [round(a, 6) for a in au[:3]] == [0.663117, 0.458333, 0.668771]
        assert math.isnan(au[3]) and au[4] == -math.inf
        assert [round(t.eu, 6) for t in gen.tokens[:5]] == [0.038462, 0.333333, 0.090909, 0.285714, 0.8]
        assert math.isnan(gen.tokens[3].uncertainty)
        assert math.isnan(gen.reliability)  # a NaN token makes the top-N mean NaN, never dropped
    clamped = ScriptedBackend([PARIS]).generate("q")
    assert clamped.evidence == "clamped" and math.isfinite(clamped.reliability)


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


# -- stop strings: the same cut as the transformers backend's step recorder ---------------------
class PieceTokenizer:
    """Token id i decodes to PIECES[i]: each scripted piece is one token of the recorder."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int], **kwargs: object) -> str:
        return "".join(self.pieces[i] for i in ids)


def recorded(answer: ScriptedAnswer, stop: tuple[str, ...], max_new_tokens: int) -> tuple[list[str], str | None, str | None]:
    """Feed the answer's pieces to a StepRecorder step by step, as generate() does; the end of the
    script is an EOS token (id ``len(pieces)``), which the scripted backend reports as "stop"."""
    from logtoku_guard.backends.recorder import StepRecorder, StepScores

    pieces = list(answer.pieces)
    eos = len(pieces)
    recorder = StepRecorder(
        k=2,
        evidence="clamped",
        tokenizer=PieceTokenizer(pieces),
        rows=1,
        stop=stop,
        eos_ids=frozenset({eos}),
        on_token=None,
        cancel=None,
    )
    for i in range(min(len(pieces) + 1, max_new_tokens)):
        row = [float(v) for v in answer.top_logits[min(i, eos - 1)]]
        logits = torch.tensor([row + [-10.0] * (eos + 1 - len(row))])  # one logit per piece id and EOS
        values, ids = logits.topk(2, dim=-1)
        au, eu = logtoku(values)
        lse = logits.logsumexp(-1).tolist()
        recorder.pending = StepScores(values.tolist(), ids.tolist(), au.tolist(), eu.tolist(), logits, lse, [0.0])
        if recorder(torch.tensor([[i]])).all():
            break
    row_state = recorder.finish_row(0)
    return [t.text for t in row_state.tokens], row_state.stop_sequence, row_state.finish_reason


STOPS = [(), ("\n",), ("is.", "zzz"), ("apital",), ("Next", " is"), ("s", "is"), ("Paris.\nN",), ("e c", "he"), ("x",)]


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("max_new_tokens", [3, 5, 8, 20])
def test_stop_strings_cut_like_the_step_recorder(stop: tuple[str, ...], max_new_tokens: int) -> None:
    gen = ScriptedBackend([PARIS]).generate("q", DecodingOptions(stop=stop, max_new_tokens=max_new_tokens))
    pieces, seq, reason = recorded(PARIS, stop, max_new_tokens)
    assert [t.text for t in gen.tokens] == pieces
    assert gen.stop_sequence == seq
    if seq is not None:
        assert gen.finish_reason == reason == "stop"
    # (without a stop string the finish reasons may differ at the boundary: the scripted answer's
    # end is an EOS that max_new_tokens does not count, see test_max_new_tokens_gives_length)
