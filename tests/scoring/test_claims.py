"""The answer's claim words and their statistics (logtoku_guard.scoring.claims)."""

from __future__ import annotations

import math

import pytest

from logtoku_guard import ScriptedAnswer, ScriptedBackend
from logtoku_guard.scoring.claims import ClaimStats, claim_words, question_echo
from logtoku_guard.scoring.stats import HIGHER_IS_RELIABLE, STAT_NAMES, ResponseStats


def generation(pieces: list[str], logits: list[list[float]], question: str) -> object:
    return ScriptedBackend([ScriptedAnswer(pieces, logits)]).generate(question)


def test_claim_words_skip_function_words_punctuation_and_what_the_question_already_says() -> None:
    g = generation(
        ["The", " capital", " of", " France", " is", " Par", "is", "."],
        [[5.0, 1.0]] * 5 + [[1.0, 0.9], [9.0, 0.0], [9.0, 0.0]],
        "What is the capital of France?",
    )
    words = claim_words(g.tokens, g.prompt)  # type: ignore[attr-defined]
    assert [w.text for w in words] == ["Paris."]
    (paris,) = words
    assert paris.token_indices == (5, 6, 7)
    assert paris.eu == max(t.eu for t in g.tokens[5:8])  # type: ignore[attr-defined]
    assert paris.logprob == g.tokens[5].logprob  # type: ignore[attr-defined]  # the first token chose the word


def test_claim_stats_summarise_the_claim_words_and_are_nan_when_nothing_new_is_said() -> None:
    q = "Who founded the Velmora Institute?"
    g = generation(
        [" The", " Velmora", " Institute", " was", " founded", " by", " Anna", " Holt", " in", " 1987"],
        [[5.0, 1.0]] * 6 + [[1.0, 0.8], [2.0, 0.5], [5.0, 1.0], [0.5, 0.4]],
        q,
    )
    words = claim_words(g.tokens, q)  # type: ignore[attr-defined]
    assert [w.text for w in words] == ["Anna", "Holt", "1987"]
    stats = ClaimStats.from_tokens(g.tokens, q)  # type: ignore[attr-defined]
    assert stats.claim_max_eu == pytest.approx(max(w.eu for w in words))
    assert stats.claim_mean_eu == pytest.approx(sum(w.eu for w in words) / 3)
    assert stats.claim_min_logprob == pytest.approx(min(w.logprob for w in words))
    assert claim_words(g.tokens, q, limit=2)[-1].text == "Holt"  # type: ignore[attr-defined]
    echo = generation([" The", " Velmora", " Institute"], [[5.0, 1.0]] * 3, q)
    repeated = vars(ClaimStats.from_tokens(echo.tokens, q))  # type: ignore[attr-defined]
    assert repeated.pop("question_echo") == 1.0  # both content words asked ("founded" is a template word)
    assert all(math.isnan(v) for v in repeated.values())


def test_claim_statistics_are_response_statistics_with_their_direction() -> None:
    q = "Who wrote Hamlet?"
    g = generation([" Shakespeare", "."], [[6.0, 1.0], [8.0, 0.0]], q)
    stats = ResponseStats.from_generation(g)  # type: ignore[arg-type]
    for name in ("claim_max_eu", "claim_mean_eu", "claim_min_logprob", "claim_mean_logprob"):
        assert name in STAT_NAMES and math.isfinite(stats.get(name)), name
    assert {"claim_min_logprob", "claim_mean_logprob"} <= HIGHER_IS_RELIABLE
    assert "claim_max_eu" not in HIGHER_IS_RELIABLE
    empty = ResponseStats.from_generation(generation([" Hamlet"], [[6.0, 1.0]], q))  # type: ignore[arg-type]
    assert empty.undefined_reason("claim_max_eu") == "the answer asserts no content word beyond the question"


def test_question_echo_is_the_share_of_the_question_content_words_the_answer_repeats() -> None:
    q = "What is the capital of France?"
    restated = generation(["The", " capital", " of", " France", " is", " Paris", "."], [[5.0, 1.0]] * 7, q)
    assert question_echo(restated.tokens, q) == 1.0  # type: ignore[attr-defined]
    off_topic = generation(["L'", "Étoile", ",", " la", " Marseillaise"], [[5.0, 1.0]] * 5, q)  # llama.cpp's answer, round 3
    assert question_echo(off_topic.tokens, q) == 0.0  # type: ignore[attr-defined]
    terse = generation(["Paris", ",", " France"], [[5.0, 1.0]] * 3, q)
    assert question_echo(terse.tokens, q) == 0.5  # type: ignore[attr-defined]  # france of {capital, france}
    possessive = generation(["France", "'s", " Paris"], [[5.0, 1.0]] * 3, q)
    assert question_echo(possessive.tokens, q) == 0.0  # type: ignore[attr-defined]  # whole words only: "france's"
    assert math.isnan(question_echo(terse.tokens, "Who is it?"))  # type: ignore[attr-defined]  # no content word asked
    stats = ResponseStats.from_generation(off_topic)  # type: ignore[arg-type]
    assert stats.question_echo == 0.0 and "question_echo" in HIGHER_IS_RELIABLE
    assert (
        ResponseStats.from_generation(generation(["Yes"], [[5.0, 1.0]], "Who is it?")).undefined_reason(  # type: ignore[arg-type]
            "question_echo"
        )
        == "the question has no content word"
    )
