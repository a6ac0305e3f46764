"""A profile's guard on the held-out test half of the shipped self-labelled questions.

    python benchmarks/guard_score/test_half.py --backend llamacpp --model gemma3-270m \\
        --profile logtoku_guard/calibration/data/profile-gemma-3-270m-q4_k_m_llamacpp-k2-clamped.json

``calibrate --fit-guard`` fits on the *tune* half; this answers the *test* half the same way
(greedy, 64 tokens, the question alone, ended by the model's own stop strings where its packaged
record has them: Gemma's blank line), scores each answer with the profile's guard and prints,
at the default policy's threshold on that profile, each group's flag rate and the AUROC of right
vs wrong answers, with percentile-bootstrap 95% intervals (1,000 resamples, seed 0). Nothing is
fit here. Prints figures; asserts nothing. ``--profile`` may be given several times: the answers
are made once and scored with each profile in turn (the same resampling order for each).
"""

from __future__ import annotations

import argparse

import numpy as np

from logtoku_guard.calibration import ModelProfile
from logtoku_guard.calibration.prompts import answer_in_batches
from logtoku_guard.calibration.self_labels import GROUPS, labelled_questions, outcome_of
from logtoku_guard.decision.conditions import resolve_threshold
from logtoku_guard.decision.policy import default_policy
from logtoku_guard.scoring.guard_score import auroc, with_guard_score
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.types import DecodingOptions


def _backend(name: str, model: str) -> object:
    if name == "llamacpp":
        from logtoku_guard.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend(model, max_batch=8)
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("transformers", "llamacpp"), default="transformers")
    parser.add_argument("--model", default="embedded")
    parser.add_argument(
        "--profile", required=True, action="append", help="a profile with a fitted guard (calibrate's output); repeatable"
    )
    args = parser.parse_args()
    profiles = [ModelProfile.load(path) for path in args.profile]
    for path, profile in zip(args.profile, profiles, strict=True):
        if profile.guard is None:
            parser.error(f"{path} has no fitted guard; run logtoku-guard calibrate --fit-guard")
    backend = _backend(args.backend, args.model)
    questions = labelled_questions("test")
    answers = answer_in_batches(backend, [q.question for q in questions], DecodingOptions(max_new_tokens=64), 8, None)  # type: ignore[arg-type]
    outcomes = np.array([outcome_of(q, g.text) for q, g in zip(questions, answers, strict=True)])
    stats = [ResponseStats.from_generation(g) for g in answers]
    stopped = np.mean([g.finish_reason == "stop" for g in answers])
    print(f"mean answer tokens {np.mean([len(g.tokens) for g in answers]):.1f}; ended before the limit {stopped:.1%}")
    for path, profile in zip(args.profile, profiles, strict=True):
        print(f"-- {path}")
        report(profile, outcomes, np.array([with_guard_score(s, profile.guard).guard_score for s in stats]))


def report(profile: ModelProfile, outcomes: np.ndarray, scores: np.ndarray) -> None:
    """Each group's flag rate at the default policy's threshold on ``profile``, and the AUROC of right vs wrong."""
    (rule,) = default_policy().rules
    threshold, _, guarantee = resolve_threshold(rule.when, profile)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    print(f"threshold {threshold:.4g}: {guarantee}")
    for group in GROUPS:
        flagged = ~(scores[outcomes == group] >= threshold)
        boots = [np.mean(rng.choice(flagged, len(flagged))) for _ in range(1000)] if len(flagged) else [np.nan]
        low, high = np.percentile(boots, [2.5, 97.5])
        print(f"{group}: flagged {100 * np.mean(flagged):.1f}% [{100 * low:.1f}, {100 * high:.1f}] (n={len(flagged)})")
    real = np.isin(outcomes, ["real-correct", "real-wrong"])
    right, s = outcomes[real] == "real-correct", scores[real]
    aurocs: list[float] = []
    for _ in range(1000):
        i = rng.integers(0, len(s), len(s))
        if right[i].any() and (~right[i]).any():
            aurocs.append(auroc(s[i], right[i]))
    low, high = np.percentile(aurocs, [2.5, 97.5])
    print(f"AUROC right vs wrong {100 * auroc(s, right):.1f} [{100 * low:.1f}, {100 * high:.1f}]; accuracy {right.mean():.3f}")


if __name__ == "__main__":
    main()
