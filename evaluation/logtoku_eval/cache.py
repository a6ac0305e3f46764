"""The generation cache: one JSONL file per (model, dataset, K stored, decoding).

Line 1 is a header ``{"meta": {...}}`` naming what the file holds; every further line is one
question's record, appended (and flushed) as soon as it is generated, so an interrupted run
resumes where it stopped: ids already present are skipped. A half-written last line (the
process was killed mid-write) is ignored when reading and cut off before the next append.
Any other line that is not a valid record (edited by hand, damaged) stops the read with a
:class:`~logtoku_guard.errors.ConfigurationError` naming the file, the line number and the fix
(delete that line, or the file: the cache is resumable); reading never changes the file, so
no other line is lost. Lines are split on ``\n`` only (an answer may hold U+2028).
One writer per file at a time (readers may run alongside). Re-scoring a method reads the
records and never regenerates.

Record types (frozen dataclasses, JSON with ``to_json``/``from_json``):

* :class:`CachedGeneration`: the greedy answer, every token's id, text, raw top-K logits
  (largest first, K = ``k_stored``, 5 by default so K = 2 and K = 5 can both be re-scored
  with :func:`logtoku_guard.scoring.uncertainty.rescore`), log-probability and entropy;
* :class:`CachedSamples`: sampled answers (text, token count and length-normalised NLL);
* :class:`CachedLabelLogits`: raw logits of a fixed set of label tokens (GoEmotions).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from logtoku_guard.errors import ConfigurationError

CACHE_FORMAT = 1


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


@dataclass(frozen=True)
class CachedToken:
    """One generated token. ``top_logits``: raw logits, largest first; ``logprob`` of the chosen
    token and ``entropy`` (nats) of the full softmax of the raw logits."""

    id: int
    text: str
    top_logits: tuple[float, ...]
    top_ids: tuple[int, ...]
    logprob: float
    entropy: float


@dataclass(frozen=True)
class CachedGeneration:
    """One question's greedy answer with every token's raw top-K logits."""

    kind: ClassVar[str] = "generation"
    id: str
    question: str
    answer: str
    finish_reason: str
    tokens: tuple[CachedToken, ...]
    prompt_tokens: tuple[CachedToken, ...] = ()
    """The user turn's tokens scored teacher-forced at the prefill pass
    (:attr:`logtoku_guard.types.Generation.prompt_scores`); empty in older caches."""

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "finish_reason": self.finish_reason,
            "tokens": [_token_json(t) for t in self.tokens],
        }
        if self.prompt_tokens:
            out["prompt_tokens"] = [_token_json(t) for t in self.prompt_tokens]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CachedGeneration:
        return cls(
            id=str(obj["id"]),
            question=obj["question"],
            answer=obj["answer"],
            finish_reason=obj["finish_reason"],
            tokens=tuple(_token_from_json(t) for t in obj["tokens"]),
            prompt_tokens=tuple(_token_from_json(t) for t in obj.get("prompt_tokens", ())),
        )


def _token_json(t: CachedToken) -> dict[str, Any]:
    return {
        "id": t.id,
        "text": t.text,
        "top_logits": [_num(v) for v in t.top_logits],
        "top_ids": list(t.top_ids),
        "logprob": _num(t.logprob),
        "entropy": _num(t.entropy),
    }


def _token_from_json(t: dict[str, Any]) -> CachedToken:
    return CachedToken(
        id=int(t["id"]),
        text=t["text"],
        top_logits=tuple(_float(v) for v in t["top_logits"]),
        top_ids=tuple(int(i) for i in t["top_ids"]),
        logprob=_float(t["logprob"]),
        entropy=_float(t["entropy"]),
    )


@dataclass(frozen=True)
class CachedSample:
    """One sampled answer; ``nll``: minus the mean token log-prob (nats per token, higher = less likely)."""

    text: str
    n_tokens: int
    nll: float


@dataclass(frozen=True)
class CachedSamples:
    """A question's sampled answers (e.g. 10 at temperature 0.5)."""

    kind: ClassVar[str] = "samples"
    id: str
    question: str
    samples: tuple[CachedSample, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "samples": [{"text": s.text, "n_tokens": s.n_tokens, "nll": _num(s.nll)} for s in self.samples],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CachedSamples:
        return cls(
            id=str(obj["id"]),
            question=obj["question"],
            samples=tuple(CachedSample(s["text"], int(s["n_tokens"]), _float(s["nll"])) for s in obj["samples"]),
        )


@dataclass(frozen=True)
class CachedLabelLogits:
    """Raw next-token logits of each label's token at the answer's first position, in label order."""

    kind: ClassVar[str] = "label-logits"
    id: str
    logits: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "logits": [_num(v) for v in self.logits]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CachedLabelLogits:
        return cls(id=str(obj["id"]), logits=tuple(_float(v) for v in obj["logits"]))


R = TypeVar("R", CachedGeneration, CachedSamples, CachedLabelLogits)
T = TypeVar("T")


def slug(name: str) -> str:
    """``name`` as part of a file name: every run of other characters than letters, digits, ``.``, ``_`` and
    ``-`` becomes one ``_`` (``smollm2-135m-instruct@llamacpp`` -> ``smollm2-135m-instruct_llamacpp``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


@dataclass(frozen=True)
class CacheMeta:
    """What a cache file holds; two runs share a file only when every field matches."""

    model: str
    dataset: str
    k_stored: int
    decoding: str
    prompt_template: str
    record: str
    format: int = CACHE_FORMAT

    @property
    def filename(self) -> str:
        return f"{slug(self.model)}__{slug(self.dataset)}__k{self.k_stored}__{slug(self.decoding)}.jsonl"


class JsonlCache(Generic[R]):
    """An append-only JSONL cache of records of one type, keyed by record id.

    Args:
        path: the ``.jsonl`` file (created with its header when absent).
        meta: what the file must hold; an existing file with another header is an error.
        record_type: :class:`CachedGeneration`, :class:`CachedSamples` or :class:`CachedLabelLogits`.
    """

    def __init__(self, path: str | os.PathLike[str], meta: CacheMeta, record_type: type[R]) -> None:
        if meta.record != record_type.kind:
            msg = f"cache meta says record={meta.record!r} but record_type holds {record_type.kind!r}"
            raise ConfigurationError(msg)
        self.path = Path(path)
        self.meta = meta
        self._type: type[R] = record_type
        self._records: dict[str, R] = {}
        if self.path.exists():
            self._read()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            header = {"meta": {**asdict(meta), "created_at": datetime.now(timezone.utc).isoformat()}}
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text(json.dumps(header, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)

    @classmethod
    def in_dir(cls, cache_dir: str | os.PathLike[str], meta: CacheMeta, record_type: type[R]) -> JsonlCache[R]:
        """The cache for ``meta`` under ``cache_dir`` (file name from the meta)."""
        return cls(Path(cache_dir) / meta.filename, meta, record_type)

    def _read(self) -> None:
        raw = self.path.read_bytes()
        # A partial last line (interrupted mid-write) is ignored here and cut off before the
        # next append, so reading never modifies the file.
        raw = raw[: raw.rfind(b"\n") + 1]
        lines = raw.split(b"\n")[:-1]
        if not lines:
            msg = f"cache file {str(self.path)!r} is empty (no header); delete it to start again"
            raise ConfigurationError(msg)
        header = self._parse(1, lines[0], lambda obj: obj["meta"], 'the cache header {"meta": ...}')
        found = {k: header.get(k) for k in asdict(self.meta)} if isinstance(header, dict) else {}
        if found != asdict(self.meta):
            diff = {k: (found.get(k), v) for k, v in asdict(self.meta).items() if found.get(k) != v}
            msg = (
                f"cache file {str(self.path)!r} holds another run (field: (file, wanted) = {diff}); "
                "use another generation cache folder (CLI: eval --gen-cache-dir; Python: cache_dir=) or delete the file"
            )
            raise ConfigurationError(msg)
        for number, line in enumerate(lines[1:], 2):
            if line.strip():
                rec = self._parse(number, line, self._type.from_json, f"a {self._type.kind!r} record")
                self._records[rec.id] = rec  # a later line for the same id wins

    def _parse(self, number: int, line: bytes, build: Callable[[Any], T], what: str) -> T:
        """One line through ``build``; a corrupt line is a ConfigurationError naming the file, the line and the fix."""
        try:
            return build(json.loads(line.decode("utf-8")))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            fix = (
                "delete the cache file (it was written for another run or is damaged)"
                if number == 1
                else "delete that line (or the whole file): the cache is resumable, only the missing answers are generated again"
            )
            msg = (
                f"cache file {str(self.path)!r}, line {number}: not {what} ({exc.__class__.__name__}: {exc}; "
                f"starts {line[:60]!r}); {fix}. Nothing was changed in the file"
            )
            raise ConfigurationError(msg) from exc

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._records

    def __iter__(self) -> Iterator[R]:
        return iter(self._records.values())

    def done_ids(self) -> set[str]:
        return set(self._records)

    def get(self, record_id: str) -> R | None:
        return self._records.get(record_id)

    def records(self, ids: Iterable[str] | None = None) -> list[R]:
        """Records in the order of ``ids`` (missing ids skipped), else in file order."""
        if ids is None:
            return list(self._records.values())
        return [self._records[i] for i in ids if i in self._records]

    def append(self, records: Iterable[R]) -> None:
        """Append records and flush them to disk at once (one line each)."""
        lines = []
        for rec in records:
            lines.append(json.dumps(rec.to_json(), ensure_ascii=False, allow_nan=False))
            self._records[rec.id] = rec
        if lines:
            with open(self.path, "r+b") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size and (fh.seek(size - 1) is not None) and fh.read(1) != b"\n":
                    fh.seek(0)
                    fh.truncate(fh.read().rfind(b"\n") + 1)  # an interrupted write: drop its partial line
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
