"""Dynamic decoding on GoEmotions (the paper, Ma et al. 2025, section on dynamic decoding): answer one emotion label, or two?

Prompt (the user turn, then the model's chat template, then the assistant turn pre-filled
with ``"Emotion:"``)::

    Which emotion does this Reddit comment express? Options: admiration, amusement, ..., neutral.
    Comment: {text}

**Label-token mapping.** Each label is read at the first answer position as the first token
of ``" " + label`` (a leading space, since the answer follows ``"Emotion:"``); with the
embedded SmolLM2 tokenizer these 28 first tokens are all distinct (26 of the labels are a
single token, and the first pieces of the other two are still unique; :func:`label_tokens`
raises if two labels ever share a first token).
One forward pass per comment gives the raw logits ``z`` of those 28 tokens (cached).

**Decision.** The first label is always the argmax of ``z``; a second label (the runner-up)
is added when a rule fires:

* ``logtoku``: the paper's ratio ``u = EU / AU`` of the top-2 label logits (K = 2, clamped
  evidence) is *below* a threshold (little lack of knowledge relative to the spread
  between two good labels). ``AU = 0`` gives ``u = inf`` (never adds);
* ``probability``: the runner-up's probability (softmax over the label tokens) is above a
  threshold;
* ``entropy``: the entropy of that label distribution is above a threshold;
* baselines ``greedy`` (always one label) and ``top-2`` (always two).

**Score** (the paper's): per comment, +1 for each chosen label that is gold and -1 for each
that is not, floored at 0; we report the mean. Thresholds are tuned on the dev split (the
value maximising the dev mean score over every distinct dev value of the statistic) and
reported on the test split; the reference code tuned on the test set itself.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from logtoku_eval.cache import CachedLabelLogits, CacheMeta, JsonlCache
from logtoku_eval.datasets import EmotionItem
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.uncertainty import rescore

if TYPE_CHECKING:
    from logtoku_guard.backends.transformers import TransformersBackend

EMOTION_PROMPT = "Which emotion does this Reddit comment express? Options: {labels}.\nComment: {text}"
ASSISTANT_PREFIX = "Emotion:"
DECODING = "label-logits-first-token-v1"

EKMAN: dict[str, tuple[str, ...]] = {
    "anger": ("anger", "annoyance", "disapproval"),
    "disgust": ("disgust",),
    "fear": ("fear", "nervousness"),
    "joy": (
        "joy",
        "amusement",
        "approval",
        "excitement",
        "gratitude",
        "love",
        "optimism",
        "relief",
        "pride",
        "admiration",
        "desire",
        "caring",
    ),
    "sadness": ("sadness", "disappointment", "embarrassment", "grief", "remorse"),
    "surprise": ("surprise", "realization", "confusion", "curiosity"),
    "neutral": ("neutral",),
}
"""The Ekman grouping of the 28 GoEmotions labels into 7 (Demszky et al. 2020, the dataset's
``ekman_mapping.json``, with neutral kept apart)."""


def to_ekman(items: Sequence[EmotionItem], names: Sequence[str]) -> tuple[list[str], list[EmotionItem]]:
    """The 7 Ekman label names and the items with their gold labels mapped onto them."""
    groups = list(EKMAN)
    fine = {names.index(f): groups.index(g) for g, fs in EKMAN.items() for f in fs if f in names}
    missing = [f for fs in EKMAN.values() for f in fs if f not in names]
    if missing:
        msg = f"the label names lack {missing}; the Ekman grouping needs the 28 GoEmotions labels"
        raise ConfigurationError(msg)
    mapped = [EmotionItem(it.id, it.text, tuple(sorted({fine[label] for label in it.labels}))) for it in items]
    return groups, mapped


Rule = Literal["logtoku", "probability", "entropy"]
RULES: tuple[Rule, ...] = ("logtoku", "probability", "entropy")


@dataclass(frozen=True)
class LabelTokens:
    """Each label's token id (first token of ``form.format(label)``) and the form used."""

    names: tuple[str, ...]
    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]
    single_token: tuple[bool, ...]


def label_tokens(tokenizer: Any, names: Sequence[str], form: str = " {}") -> LabelTokens:
    """Map labels to the first token of ``form.format(label)``; raise when two labels share it."""
    ids, pieces, single = [], [], []
    for n in names:
        enc = tokenizer.encode(form.format(n), add_special_tokens=False)
        if not enc:
            msg = f"label {n!r} encodes to no token"
            raise ConfigurationError(msg)
        ids.append(int(enc[0]))
        pieces.append(tokenizer.convert_ids_to_tokens(enc[0]))
        single.append(len(enc) == 1)
    seen: dict[int, str] = {}
    clashes = []
    for n, i in zip(names, ids):
        if i in seen:
            clashes.append((seen[i], n))
        seen[i] = n
    if clashes:
        msg = f"labels share a first token with form {form!r}: {clashes}; rename the labels or pick another form"
        raise ConfigurationError(msg)
    return LabelTokens(tuple(names), tuple(ids), tuple(pieces), tuple(single))


def emotion_prompt(text: str, names: Sequence[str]) -> str:
    return EMOTION_PROMPT.format(labels=", ".join(names), text=text.strip())


def label_cache(cache_dir: str | os.PathLike[str], model: str, split: str, names: Sequence[str]) -> JsonlCache[CachedLabelLogits]:
    meta = CacheMeta(
        model,
        f"goemotions-{split}",
        len(names),
        DECODING,
        EMOTION_PROMPT + " || " + ASSISTANT_PREFIX + " || " + ",".join(names),
        CachedLabelLogits.kind,
    )
    return JsonlCache.in_dir(cache_dir, meta, CachedLabelLogits)


def collect_label_logits(
    backend: TransformersBackend,
    items: Sequence[EmotionItem],
    names: Sequence[str],
    cache: JsonlCache[CachedLabelLogits],
    *,
    batch_size: int = 16,
    on_progress: Callable[[int], None] | None = None,
) -> list[CachedLabelLogits]:
    """Raw next-token logits of the label tokens after ``"Emotion:"``, one forward pass per comment.

    ``backend`` is a :class:`~logtoku_guard.backends.transformers.TransformersBackend` (its
    model, tokenizer and chat template are used directly: no generation is needed).
    """
    import torch

    todo = [it for it in items if it.id not in cache]
    if not todo:
        return cache.records([it.id for it in items])
    if on_progress is not None and len(todo) < len(items):
        on_progress(len(items) - len(todo))
    mapping = label_tokens(backend.tokenizer, names)
    ids = torch.tensor(mapping.token_ids)
    tok = backend.tokenizer
    has_template = bool(getattr(tok, "chat_template", None))
    model = backend.model
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        texts = [backend.render(emotion_prompt(it.text, names)) + ASSISTANT_PREFIX for it in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=not has_template).to(model.device)
        # Left padding: positions must count real tokens only (generate() does this itself).
        position_ids = (enc["attention_mask"].cumsum(-1) - 1).clamp_min(0)
        with torch.inference_mode():
            logits = model(**enc, position_ids=position_ids).logits[:, -1, :].float()
        picked = logits[:, ids.to(logits.device)].cpu().tolist()
        cache.append(CachedLabelLogits(id=it.id, logits=tuple(row)) for it, row in zip(chunk, picked))
        if on_progress is not None:
            on_progress(len(chunk))
    return cache.records([it.id for it in items])


@dataclass(frozen=True)
class LabelStats:
    """Per comment: top-1 and top-2 label ids and the statistic of each rule.

    Directions: a *second label is added* when ``logtoku < t`` (u = EU/AU), ``probability > t``
    (runner-up probability) or ``entropy > t``.
    """

    first: np.ndarray
    second: np.ndarray
    logtoku: np.ndarray
    probability: np.ndarray
    entropy: np.ndarray

    def statistic(self, rule: Rule) -> np.ndarray:
        return {"logtoku": self.logtoku, "probability": self.probability, "entropy": self.entropy}[rule]


def label_stats(logits: np.ndarray) -> LabelStats:
    """Statistics of ``(n, L)`` raw label logits."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2 or z.shape[1] < 2:
        msg = f"label logits must be (n, L) with L >= 2 labels, got shape {z.shape}"
        raise ConfigurationError(msg)
    order = np.argsort(-z, axis=1, kind="stable")
    top2 = np.take_along_axis(z, order[:, :2], axis=1)
    r = rescore(top2, k=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(r.au > 0, r.eu / np.where(r.au > 0, r.au, 1.0), np.inf)
    shifted = z - z.max(axis=1, keepdims=True)
    p = np.exp(shifted)
    p /= p.sum(axis=1, keepdims=True)
    logp = np.log(np.clip(p, 1e-300, None))
    ent = -(p * logp).sum(axis=1)
    p2 = np.take_along_axis(p, order[:, 1:2], axis=1)[:, 0]
    return LabelStats(order[:, 0], order[:, 1], u, p2, ent)


def paper_score(chosen: Sequence[Sequence[int]], gold: Sequence[Sequence[int]]) -> np.ndarray:
    """Per comment: +1 per chosen gold label, -1 per chosen wrong label, floored at 0."""
    out = []
    for c, g in zip(chosen, gold):
        gs = set(g)
        out.append(max(0, sum(1 if x in gs else -1 for x in c)))
    return np.asarray(out, dtype=np.float64)


def decide(stats: LabelStats, rule: Rule | Literal["greedy", "top-2"], threshold: float = math.nan) -> list[list[int]]:
    """The labels chosen for each comment by ``rule`` at ``threshold``."""
    n = stats.first.size
    if rule == "greedy":
        add = np.zeros(n, dtype=bool)
    elif rule == "top-2":
        add = np.ones(n, dtype=bool)
    elif rule == "logtoku":
        add = stats.logtoku < threshold
    elif rule in ("probability", "entropy"):
        add = stats.statistic(rule) > threshold
    else:
        msg = f"unknown rule {rule!r}; use one of {(*RULES, 'greedy', 'top-2')}"
        raise ConfigurationError(msg)
    return [[int(stats.first[i]), int(stats.second[i])] if add[i] else [int(stats.first[i])] for i in range(n)]


def tune_threshold(stats: LabelStats, gold: Sequence[Sequence[int]], rule: Rule) -> tuple[float, float]:
    """The threshold maximising the mean paper score on these comments: ``(threshold, score)``.

    Candidates: midpoints between consecutive distinct values of the rule's statistic plus
    both extremes (never / always add); ties go to the threshold adding fewer labels.
    """
    values = stats.statistic(rule)
    finite = np.unique(values[np.isfinite(values)])
    mids = (finite[:-1] + finite[1:]) / 2.0 if finite.size > 1 else np.zeros(0)
    lo = (finite[0] - 1.0) if finite.size else -1.0
    hi = (finite[-1] + 1.0) if finite.size else 1.0
    # Order candidates from "adds fewest" to "adds most", so ties keep the most conservative.
    cands = np.r_[lo, mids, hi] if rule == "logtoku" else np.r_[hi, mids[::-1], lo]
    best_t, best_s = math.nan, -math.inf
    for t in cands:
        s = float(paper_score(decide(stats, rule, float(t)), gold).mean())
        if s > best_s + 1e-12:
            best_t, best_s = float(t), s
    return best_t, best_s


@dataclass(frozen=True)
class RuleResult:
    """One rule's threshold (tuned on dev) and its test score."""

    rule: str
    threshold: float
    dev_score: float
    dev_two_label_share: float
    test_score: float
    test_two_label_share: float
    test_exact_match: float
    test_auroc_second: float = math.nan
    """Threshold-free: AUROC of the rule's statistic (oriented towards "add") for "the runner-up
    label is gold" on test; NaN for greedy and top-2."""

    def to_json(self) -> dict[str, Any]:
        def j(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "rule": self.rule,
            "threshold": j(self.threshold),
            "dev_score": j(self.dev_score),
            "dev_two_label_share": self.dev_two_label_share,
            "test_score": j(self.test_score),
            "test_two_label_share": self.test_two_label_share,
            "test_exact_match": self.test_exact_match,
            "test_auroc_second": j(self.test_auroc_second),
        }


def evaluate_rules(
    dev_logits: np.ndarray, dev_gold: Sequence[Sequence[int]], test_logits: np.ndarray, test_gold: Sequence[Sequence[int]]
) -> list[RuleResult]:
    """Tune every rule on dev, report it on test; greedy and top-2 need no tuning."""
    from logtoku_eval.metrics import auroc

    dev, test = label_stats(dev_logits), label_stats(test_logits)
    second_gold = np.array([int(s) in set(g) for s, g in zip(test.second, test_gold)], dtype=bool)
    out = []
    rules: list[Rule | Literal["greedy", "top-2"]] = ["greedy", "top-2", *RULES]
    for rule in rules:
        if rule == "greedy" or rule == "top-2":
            t, dev_s = math.nan, float(paper_score(decide(dev, rule), dev_gold).mean())
            ranking = math.nan
        else:
            t, dev_s = tune_threshold(dev, dev_gold, rule)
            stat = test.statistic(rule)
            ranking = auroc(-stat if rule == "logtoku" else stat, second_gold)
        chosen = decide(test, rule, t)
        out.append(
            RuleResult(
                rule=rule,
                threshold=t,
                dev_score=dev_s,
                dev_two_label_share=float(np.mean([len(c) == 2 for c in decide(dev, rule, t)])),
                test_score=float(paper_score(chosen, test_gold).mean()),
                test_two_label_share=float(np.mean([len(c) == 2 for c in chosen])),
                test_exact_match=float(np.mean([set(c) == set(g) for c, g in zip(chosen, test_gold)])),
                test_auroc_second=ranking,
            )
        )
    return out


def rules_markdown(results: Sequence[RuleResult], n_dev: int, n_test: int, model: str) -> str:
    lines = [
        f"GoEmotions, model `{model}`: thresholds tuned on {n_dev} dev comments, reported on {n_test} test comments.",
        "",
        "| rule | adds a 2nd label when | threshold (tuned on dev) | dev score | dev 2-label share | test score "
        "| test 2-label share | test exact set | test AUROC: runner-up is gold |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    when = {
        "greedy": "never",
        "top-2": "always",
        "logtoku": "u = EU/AU < t",
        "probability": "p(runner-up) > t",
        "entropy": "H(labels) > t",
    }
    for r in results:
        t = "-" if not math.isfinite(r.threshold) else f"{r.threshold:.4g}"
        if r.rule in RULES and r.dev_two_label_share == 0.0:
            t += " (never adds)"
        lines.append(
            f"| {r.rule} | {when[r.rule]} | {t} | {r.dev_score:.4f} | {r.dev_two_label_share:.1%} | {r.test_score:.4f} | "
            f"{r.test_two_label_share:.1%} | {r.test_exact_match:.1%} | "
            f"{'-' if not math.isfinite(r.test_auroc_second) else f'{100 * r.test_auroc_second:.1f}'} |"
        )
    return "\n".join(lines)
