"""A small lexical retriever for the guard's ``retrieve`` action (no embedding model needed).

Passages are ranked by BM25 over lower-cased word tokens. For production use, plug in any
retriever (a LangChain ``BaseRetriever``, a LlamaIndex retriever, a vector store) instead.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from logtoku_guard.errors import ConfigurationError

MAX_CONTEXT_BYTES = 50_000_000
"""Largest context file read (``ask --context-file``); a larger corpus belongs in a real retriever."""

_WORD = re.compile(r"\w+", re.UNICODE)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


class KeywordRetriever:
    """BM25 over a fixed list of passages: ``retrieve(query)`` returns the best ``k`` with a match."""

    def __init__(self, passages: Sequence[str], k: int = 4, k1: float = 1.5, b: float = 0.75) -> None:
        self.passages = [p for p in passages if p.strip()]
        if not self.passages:
            msg = "KeywordRetriever needs at least one non-empty passage"
            raise ConfigurationError(msg)
        if k < 1:
            msg = f"k must be >= 1, got {k!r}"
            raise ConfigurationError(msg)
        self.k, self.k1, self.b = k, k1, b
        self._docs = [Counter(_words(p)) for p in self.passages]
        self._lengths = [sum(d.values()) for d in self._docs]
        self._avg = sum(self._lengths) / len(self._lengths)
        df: Counter[str] = Counter()
        for d in self._docs:
            df.update(d.keys())
        n = len(self._docs)
        self._idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}

    @classmethod
    def from_file(cls, path: str | Path, k: int = 4) -> KeywordRetriever:
        """Passages separated by blank lines in a UTF-8 text file (a missing, unreadable or non-UTF-8
        file raises :class:`ConfigurationError` naming it and the fix)."""
        from logtoku_guard.files import read_bounded_text

        p = Path(path)
        if not p.exists():
            msg = f"context file {str(p)!r} does not exist; give a text file with passages separated by blank lines"
            raise ConfigurationError(msg)
        text = read_bounded_text(p, MAX_CONTEXT_BYTES, "context file")
        return cls([x.strip() for x in re.split(r"\n\s*\n", text)], k=k)

    def retrieve(self, query: str) -> list[str]:
        terms = set(_words(query))
        scored = []
        for i, (doc, length) in enumerate(zip(self._docs, self._lengths)):
            s = 0.0
            for w in terms:
                tf = doc.get(w, 0)
                if tf:
                    s += self._idf[w] * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * length / self._avg))
            if s > 0:
                scored.append((s, i))
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [self.passages[i] for _, i in scored[: self.k]]
