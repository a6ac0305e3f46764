"""The answer's claim: the words it asserts beyond the question, and how sure the model was of them.

A wrong or invented answer differs from a right one less in its template words ("The capital
of ... is", "was founded by", words it copies from the question) than in the entity, name or
number it asserts. :func:`claim_words` keeps the answer's words that carry content (not a
function word, not punctuation) and do not already occur in the question; :class:`ClaimStats`
summarises the model's EU and log-probability over the first :data:`CLAIM_WORDS` of them:

* ``claim_max_eu`` / ``claim_mean_eu``: word EU (max over the word's tokens), higher = more
  uncertain;
* ``claim_min_logprob`` / ``claim_mean_logprob``: the log-probability of each word's first
  token, where the model chose the word (its later tokens mostly complete it), higher = more
  reliable.

All NaN when the answer asserts nothing new (an empty answer, or one that only repeats the
question). And ``question_echo``: the share of the question's content words that the answer
repeats (NaN when the question has none); an answer that does not address the question (another
language, another subject) repeats none of it. Everything comes from the answer's own tokens and
the question's text: no extra pass.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from logtoku_guard.scoring.uncertainty import word_scores
from logtoku_guard.types import TokenScore

__all__ = ["CLAIM_WORDS", "FUNCTION_WORDS", "ClaimStats", "ClaimWord", "claim_words", "question_echo"]

CLAIM_WORDS = 8
"""How many of the answer's new content words are summarised (the main claim comes first)."""

FUNCTION_WORDS = frozenset(
    """a an the and or but nor so yet if then than that this these those there here
    is are was were be been being am do does did done have has had having will would shall should can could may might must
    i you he she it we they me him her us them my your his its our their mine yours hers ours theirs
    who whom whose which what when where why how whoever whatever
    of in on at by for with without from to into onto upon about above below over under between among through during
    before after since until while as like also too very just only not no yes all any some each every both either neither
    more most less least much many few one ones other another such same own
    known called named based located founded established
    sorry however although though because therefore thus""".split()  # noqa: SIM905
)
"""Words that never carry the claim: articles, pronouns, auxiliaries, prepositions and a few
answer-template verbs ("known", "called", "founded")."""

_WORD = re.compile(r"[\w]+(?:[.'\-][\w]+)*", re.UNICODE)


def _normal(word: str) -> str:
    m = _WORD.search(word.lower())
    return m.group(0) if m else ""


@dataclass(frozen=True)
class ClaimWord:
    """One asserted word: its text, max AU/EU over its tokens, its first token's log-probability."""

    text: str
    au: float
    eu: float
    logprob: float
    token_indices: tuple[int, ...]


def claim_words(tokens: Sequence[TokenScore], question: str, limit: int | None = CLAIM_WORDS) -> list[ClaimWord]:
    """The answer's content words not already in ``question``, in order (at most ``limit``)."""
    asked = {_normal(w) for w in question.split()}
    out: list[ClaimWord] = []
    for w in word_scores([t.text for t in tokens], [t.au for t in tokens], [t.eu for t in tokens]):
        key = _normal(w.text)
        if not key or key in FUNCTION_WORDS or key in asked:
            continue
        out.append(ClaimWord(w.text, w.au, w.eu, float(tokens[w.token_indices[0]].logprob), w.token_indices))
        if limit is not None and len(out) >= limit:
            break
    return out


def question_echo(tokens: Sequence[TokenScore], question: str) -> float:
    """The share of ``question``'s content words (not :data:`FUNCTION_WORDS`) that the answer's words
    repeat, 0 to 1; NaN when the question has no content word."""
    asked = {k for w in question.split() if (k := _normal(w)) and k not in FUNCTION_WORDS}
    if not asked:
        return math.nan
    said = {_normal(w) for w in "".join(t.text for t in tokens).split()}
    return len(asked & said) / len(asked)


@dataclass(frozen=True)
class ClaimStats:
    """Summary of the claim words' scores (NaN when the answer asserts no new content word), and
    how much of the question the answer repeats (:func:`question_echo`)."""

    claim_max_eu: float
    claim_mean_eu: float
    claim_min_logprob: float
    claim_mean_logprob: float
    question_echo: float = math.nan

    @classmethod
    def from_tokens(cls, tokens: Sequence[TokenScore], question: str) -> ClaimStats:
        words = claim_words(tokens, question)
        echo = question_echo(tokens, question)
        if not words:
            return cls(math.nan, math.nan, math.nan, math.nan, echo)
        eu = [w.eu for w in words]
        lp = [w.logprob for w in words]
        nan_eu = any(math.isnan(v) for v in eu)
        return cls(
            claim_max_eu=math.nan if nan_eu else max(eu),
            claim_mean_eu=math.nan if nan_eu else sum(eu) / len(eu),
            claim_min_logprob=min(lp),
            claim_mean_logprob=sum(lp) / len(lp),
            question_echo=echo,
        )
