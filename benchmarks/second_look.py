"""Second looks on the ordinary-questions benchmark: each statistic alone and the cascade policy, against one pass.

Two steps, one command::

    nice -n 10 python benchmarks/second_look.py --questions 40            # measure (resumable) then report
    python benchmarks/second_look.py --report-only --policy cascade        # the table again, from the cache

**measure**: for a sample of ``--questions`` questions of each half (tune, test; every wording of
each, drawn with ``--seed``, stratified by category), the first pass is made as ``ask`` makes it
(the question alone, greedy, 64 tokens; timed one answer at a time), judged with the benchmark's
``nq-match`` judge, and then every look is taken on it with :meth:`BackendIO.measure` (the guard's
own code; the settings of ``--policy``'s ``second_look`` section). Each answer is one line of
``--cache`` (wall and CPU seconds and tokens of the first pass and of each look, its statistics).

**report**, per half and wording: the one-pass default policy; each second-look statistic alone
(AUROC correct vs wrong over every answer; flagged/passed at the threshold that passes 85% of
the *tune* half's correct answers); and the cascade policy, run through the real guard loop
(:func:`~logtoku_guard.guard.driver.drive`) with an I/O that answers from the cache, so the
looks it takes are those the policy asks for: the share of answers that took a look, and the
cost per answer against one pass (mean and p95 of tokens, wall and CPU seconds). ``--fit``
searches the cascade's thresholds on the tune half (targets: >= 85% of correct answers passed
per wording, at most 1.5x one pass's mean CPU time) and prints the best and the frontier.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.guard.driver import drive
from logtoku_guard.guard.guard_io import BackendIO
from logtoku_guard.guard.guard_steps import Answer, Generate, Measure, Measured, Retrieve, Retrieved
from logtoku_guard.scoring.guard_score import auroc
from logtoku_guard.scoring.second_look import SECOND_LOOK_HIGHER_IS_RELIABLE, Look, Measurement
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation

LOOKS: tuple[Look, ...] = ("self_check", "sampling", "paraphrase")
STATS = ("self_check_yes", "self_check_eu", "sampling_agreement", "paraphrase_agreement")
WORDINGS = ("sentence", "lower", "paraphrase")
SERVING = DecodingOptions(max_new_tokens=64)


# -- measure ------------------------------------------------------------------------------------------
def _sample(items: Sequence[Any], questions: int, seed: int) -> list[Any]:
    by_q: dict[str, list[Any]] = {}
    for it in items:
        by_q.setdefault(it.question_id, []).append(it)
    by_cat: dict[str, list[str]] = {}
    for qid, its in by_q.items():
        by_cat.setdefault(its[0].category, []).append(qid)
    rng = random.Random(seed)
    order = {cat: rng.sample(qids, len(qids)) for cat, qids in sorted(by_cat.items())}
    chosen: list[str] = []
    while len(chosen) < min(questions, len(by_q)):  # round robin over categories: stratified
        for cat in sorted(order):
            if order[cat] and len(chosen) < questions:
                chosen.append(order[cat].pop())
    return [it for qid in chosen for it in by_q[qid]]


GREEDY = "/work/evalcache/smollm2-135m-instruct__ordinary-8706935e__k5__greedy-max64-nostop.jsonl"


def measure(args: argparse.Namespace, policy: Policy) -> None:
    """Take ``--looks`` on every first-pass answer of the greedy cache (``eval ordinary``'s, as ``ask`` makes
    them) not yet in ``--cache`` (only those with guard_score below ``--band`` when given), until ``--until``
    (HH:MM UTC) or the end; every ``--time-every``-th answer also has its first pass made again and timed."""
    from datetime import datetime, timezone

    from logtoku_eval.cache import CachedGeneration
    from logtoku_eval.fabricated_eval import generation_from_cached
    from logtoku_eval.ordinary import load_ordinary
    from logtoku_guard.backends.transformers import TransformersBackend
    from logtoku_guard.calibration.profiles import load_profile_for
    from logtoku_guard.calibration.self_labels import answer_matches

    items = {it.id: it for it in load_ordinary(split="all")}
    cache = Path(args.cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    backend = TransformersBackend(device="cpu")
    profile = load_profile_for(backend.model_name)
    scorer = Decider(default_policy(), profile)
    looks = tuple(args.looks.split(","))
    settings = policy.second_look
    stop_at = None
    if args.until:
        hh, mm = (int(x) for x in args.until.split(":"))
        stop_at = datetime.now(timezone.utc).replace(hour=hh, minute=mm, second=0)
    n = 0
    skipped: set[str] = set()
    while True:
        done = set(skipped)
        if cache.exists():
            with cache.open(encoding="utf-8") as f:
                done |= {json.loads(line)["id"] for line in f}
        with Path(args.greedy).open(encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        todo = [d for d in records if "id" in d and d["id"] in items and d["id"] not in done]
        if not todo:
            if stop_at is None or datetime.now(timezone.utc) >= stop_at:
                return
            time.sleep(30)
        for d in todo:
            if stop_at is not None and datetime.now(timezone.utc) >= stop_at:
                return
            it = items[d["id"]]
            generation = generation_from_cached(CachedGeneration.from_json(d), backend.model_name)
            guard_score = scorer._stats(generation).guard_score
            in_band = args.band is None or guard_score < args.band
            if (not in_band and looks == ("sampling",)) or (not in_band and looks == ("paraphrase",)):
                skipped.add(d["id"])
                continue
            messages = [ChatMessage("user", it.question)]
            rendered = backend.render(messages)
            first: dict[str, float] = {"tokens": len(backend.tokenizer(rendered)["input_ids"]) + len(generation.tokens)}
            first.update(d.get("timing", {}))
            n += 1
            if args.time_every and n % args.time_every == 1:
                wall, cpu = time.perf_counter(), time.process_time()
                again = backend.generate(messages, SERVING)
                first.update(seconds=time.perf_counter() - wall, cpu_s=time.process_time() - cpu, again_tokens=len(again.tokens))
            io = BackendIO(backend, messages, policy.retrieve, options=SERVING)
            taken = []
            for look in looks:
                if look != "self_check" and not in_band:
                    continue
                cpu = time.process_time()
                (m,) = io.measure(Measure((look,), it.question, generation, 1, settings)).measurements  # type: ignore[arg-type]
                taken.append({**_measurement_json(m), "cpu_s": time.process_time() - cpu})
            line = {
                "id": it.id,
                "split": it.split,
                "wording": it.wording,
                "correct": bool(answer_matches(generation.text, it.answers)[0]),
                "guard_score": guard_score,
                "first": first,
                "looks": taken,
                "generation": d,
            }
            with cache.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        if stop_at is None:
            return


def make_greedy(args: argparse.Namespace) -> None:
    """First passes of a stratified sample of ``--questions`` questions of the tune half (every wording), made as
    ``ask`` makes them, each timed, in ``--greedy``'s format (a ``timing`` key added)."""
    from logtoku_eval.generate import to_cached
    from logtoku_eval.ordinary import load_ordinary
    from logtoku_guard.backends.transformers import TransformersBackend

    out = Path(args.greedy)
    done = set()
    if out.exists():
        with out.open(encoding="utf-8") as f:
            done = {json.loads(line).get("id") for line in f}
    todo = [it for it in _sample(load_ordinary(split="tune"), args.questions, args.seed) if it.id not in done]
    backend = TransformersBackend(device="cpu")
    for it in todo:
        wall, cpu = time.perf_counter(), time.process_time()
        generation = backend.generate([ChatMessage("user", it.question)], SERVING)
        line = to_cached(it.to_qa_item(), generation).to_json()
        line["timing"] = {"seconds": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def _measurement_json(m: Measurement) -> dict[str, Any]:
    values = {k: (v if math.isfinite(v) else None) for k, v in m.values.items()}
    return {"look": m.look, "values": values, "tokens": m.tokens, "seconds": m.seconds, "inputs": dict(m.inputs), "why": m.why}


# -- replay through the guard loop --------------------------------------------------------------------
@dataclass
class Row:
    id: str
    split: str
    wording: str
    correct: bool
    generation: Generation
    first: dict[str, float]
    looks: dict[str, dict[str, Any]]

    def value(self, stat: str) -> float:
        for m in self.looks.values():
            v = m["values"].get(stat, "absent")
            if v != "absent":
                return math.nan if v is None else float(v)
        return math.nan


def load_rows(paths: Sequence[Path], model: str) -> list[Row]:
    """The answers of every cache in ``paths``, their looks merged by answer id."""
    from logtoku_eval.cache import CachedGeneration
    from logtoku_eval.fabricated_eval import generation_from_cached

    rows: dict[str, Row] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.open(encoding="utf-8"):
            d = json.loads(line)
            if d["id"] not in rows:
                g = generation_from_cached(CachedGeneration.from_json(d["generation"]), model)
                rows[d["id"]] = Row(d["id"], d["split"], d["wording"], d["correct"], g, dict(d["first"]), {})
            row = rows[d["id"]]
            row.first.update(d["first"])
            row.looks.update({m["look"]: m for m in d["looks"]})
    return list(rows.values())


class CachedIO:
    """The guard loop's requests answered from the cache: the first pass, and each look when asked."""

    def __init__(self, row: Row) -> None:
        self.row = row
        self.taken: list[str] = []

    def generate(self, request: Generate, watch: Any) -> Answer:
        return Answer(self.row.generation)

    def retrieve(self, request: Retrieve) -> Retrieved:
        return Retrieved(why="no retriever in this benchmark")

    def measure(self, request: Measure) -> Measured:
        out = []
        for look in request.looks:
            m = self.row.looks[look]
            self.taken.append(look)
            values = {k: (math.nan if v is None else v) for k, v in m["values"].items()}
            out.append(Measurement(look, values, m["tokens"], m["seconds"], m["inputs"], m["why"]))
        return Measured(tuple(out))


@dataclass(frozen=True)
class Outcome:
    """What a policy did with one answer: flagged or not, the looks it took and their tokens and CPU seconds."""

    flagged: bool
    looks: tuple[str, ...]
    look_tokens: float
    look_cpu_s: float


def run_policy(decider: Decider, row: Row) -> Outcome | None:
    """The policy on ``row`` through the guard loop; None when it asks for a look not measured for this answer."""
    io = CachedIO(row)
    try:
        result = drive(decider, row.generation.prompt, io)
    except KeyError:
        return None
    tokens = sum(row.looks[lk]["tokens"] for lk in io.taken)
    cpu = sum(row.looks[lk]["cpu_s"] for lk in io.taken)
    return Outcome(result.action != "pass", tuple(io.taken), tokens, cpu)


def one_pass_cpu(rows: Sequence[Row]) -> tuple[float, int]:
    """Mean CPU seconds of one pass over the answers whose first pass was made again and timed, and their number."""
    timed = [r.first["cpu_s"] for r in rows if "cpu_s" in r.first]
    return (float(np.mean(timed)) if timed else math.nan), len(timed)


def cost_cell(part: Sequence[Row], outcomes: Sequence[Outcome], cpu1: float) -> str:
    """Mean and p95 cost per answer against one pass: tokens exactly, CPU seconds as the mean timed one pass plus each look."""
    tok1 = np.array([r.first["tokens"] for r in part], dtype=float)
    tok2 = tok1 + np.array([o.look_tokens for o in outcomes])
    cpu2 = cpu1 + np.array([o.look_cpu_s for o in outcomes])
    return (
        f"CPU {cpu2.mean() / cpu1:.2f}x (p95 {np.percentile(cpu2, 95) / cpu1:.2f}x); "
        f"tokens {tok2.mean() / tok1.mean():.2f}x (p95 {np.percentile(tok2, 95):.0f} vs {np.percentile(tok1, 95):.0f})"
    )


# -- report -------------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def rates(rows: Sequence[Row], flagged: Sequence[bool]) -> tuple[float, float, int, int]:
    wrong = [f for r, f in zip(rows, flagged) if not r.correct]
    right = [not f for r, f in zip(rows, flagged) if r.correct]
    return (float(np.mean(wrong)) if wrong else math.nan, float(np.mean(right)) if right else math.nan, len(right), len(wrong))


def _auroc(rows: Sequence[Row], score: Sequence[float]) -> float:
    pairs = [(s, r.correct) for r, s in zip(rows, score) if math.isfinite(s)]
    if len({c for _, c in pairs}) < 2:
        return math.nan
    return float(auroc([s for s, _ in pairs], [c for _, c in pairs]))


def reliable(stat: str, v: float) -> float:
    return v if stat in SECOND_LOOK_HIGHER_IS_RELIABLE else -v


def threshold_passing(rows: Sequence[Row], stat: str, share: float) -> float:
    """The reliable-direction score that passes ``share`` of ``rows``' correct answers (NaN counts as least reliable)."""
    scores = sorted(reliable(stat, r.value(stat)) if math.isfinite(r.value(stat)) else -math.inf for r in rows if r.correct)
    return scores[math.floor((1 - share) * len(scores))] if scores else math.nan


def _measured(row: Row) -> set[str]:
    return {s for m in row.looks.values() for s in m["values"]}


def report(rows: list[Row], policy: Policy, profile: Any, split: str) -> str:
    tune = [r for r in rows if r.split == "tune"]
    one = Decider(default_policy(), profile)
    cascade = Decider(policy, profile)
    cuts = {s: threshold_passing([r for r in tune if s in _measured(r)], s, 0.85) for s in STATS}
    cpu1, n_timed = one_pass_cpu(rows)
    lines = [
        f"### {split} half: {policy.name} (v{policy.version}) against one pass",
        "",
        "| wording | n (correct/wrong) | one pass: wrong flagged / correct passed / AUROC | "
        + " | ".join(f"{s} alone: AUROC, flagged/passed" for s in STATS)
        + " | cascade: wrong flagged / correct passed | took a look | cost vs one pass (mean CPU s, p95; tokens mean) |",
        "|" + "---|" * (5 + len(STATS)),
    ]
    for wording in (*WORDINGS, "all"):
        part = [r for r in rows if r.split == split and (wording == "all" or r.wording == wording)]
        if not part:
            continue
        base = [one.decide(r.generation).action != "pass" for r in part]
        gs = [one._stats(r.generation).guard_score for r in part]
        wf, cp, nc, nw = rates(part, base)
        cells = [f"{wording}", f"{nc}/{nw}", f"{_pct(wf)} / {_pct(cp)} / {_pct(_auroc(part, gs))}"]
        for s in STATS:
            have = [r for r in part if s in _measured(r)]
            score = [reliable(s, r.value(s)) for r in have]
            flagged = [not (math.isfinite(v) and v >= cuts[s]) for v in score]
            f1, p1, n1, n2 = rates(have, flagged)
            cells.append(f"{_pct(_auroc(have, score))}, {_pct(f1)}/{_pct(p1)} (n {n1}/{n2})")
        ran = [(r, o) for r in part if (o := run_policy(cascade, r)) is not None]
        kept, outcomes = [r for r, _ in ran], [o for _, o in ran]
        f2, p2, nc2, nw2 = rates(kept, [o.flagged for o in outcomes])
        took = float(np.mean([bool(o.looks) for o in outcomes])) if outcomes else math.nan
        cost = cost_cell(kept, outcomes, cpu1) if outcomes else "n/a"
        cells += [f"{_pct(f2)} / {_pct(p2)} (n {nc2}/{nw2})", _pct(took), cost]
        lines.append("| " + " | ".join(cells) + " |")
    looks = {lk: [r.looks[lk]["cpu_s"] for r in rows if lk in r.looks] for lk in LOOKS}
    lines += [
        "",
        "Mean CPU seconds per look when taken: "
        + ", ".join(f"{k} {np.mean(v):.2f} (n {len(v)})" for k, v in looks.items() if v)
        + f"; one pass {cpu1:.2f} (n {n_timed} timed).",
        "Each statistic alone flags below the value that passes 85% of the tune half's correct answers: "
        + ", ".join(f"{s} {'>=' if s in SECOND_LOOK_HIGHER_IS_RELIABLE else '<='} {abs(c):.3g}" for s, c in cuts.items()),
    ]
    return "\n".join(lines)


# -- fit the cascade on the tune half -------------------------------------------------------------------
PARAPHRASE_CUTS: tuple[float | None, ...] = (None,)
"""The paraphrase look's cuts searched (None: no rule); only None while paraphrase was not measured on the tune half."""
LOOK_RULES = {
    "self_check_yes": "self-check-doubts",
    "sampling_agreement": "unstable-samples",
    "paraphrase_agreement": "unstable-wording",
}


def cascade_dict(lo: float, hi: float, cuts: dict[str, float | None], base: Policy) -> dict[str, Any]:
    """The cascade with absolute thresholds: flag below ``lo``; inside ``[lo, hi)`` one rule per look in ``cuts``
    (in that order, cheapest first; None: no rule), flagging below its cut."""
    rules: list[dict[str, Any]] = [
        {"name": "below-band", "when": {"stat": "guard_score", "op": "<", "value": lo}, "action": "retrieve"}
    ]
    for stat, cut in cuts.items():
        if cut is not None:
            band = {"stat": "guard_score", "op": "<", "value": hi}
            rules.append(
                {"name": LOOK_RULES[stat], "when": {"all": [band, {"stat": stat, "op": "<", "value": cut}]}, "action": "retrieve"}
            )
    return {
        "name": "cascade-fit",
        "rules": rules,
        "retrieve": {"max_attempts": 1, "fallback": "abstain"},
        "second_look": base.second_look.model_dump(),
    }


def fit(rows: list[Row], policy: Policy, profile: Any) -> None:
    """Grid over the band's edges (as coverage targets on the profile) and the looks' cuts, on tune only."""
    from logtoku_guard.decision.conditions import Risk, risk_threshold_for

    tune = [r for r in rows if r.split == "tune"]
    one_cpu, _ = one_pass_cpu(rows)
    edge = {}
    for c in (0.3, 0.5, 0.6, 0.7, 0.85, 0.9, 0.95):
        chosen = risk_threshold_for(Risk(coverage=c, confidence=0.9), profile.guard)
        if chosen is not None and chosen.met:
            edge[c] = chosen.threshold
    results = []
    for lo in (0.85, 0.9, 0.95):
        for hi in (0.3, 0.5, 0.6, 0.7):
            for yes in (None, 0.08, 0.12, 0.3, 0.5):
                for agree in (None, 0.25, 0.5, 0.75):
                    for para in PARAPHRASE_CUTS:
                        cuts = {"self_check_yes": yes, "sampling_agreement": agree, "paraphrase_agreement": para}
                        decider = Decider(Policy.from_dict(cascade_dict(edge[lo], edge[hi], cuts, policy)), profile)
                        ran = [(r, o) for r in tune if (o := run_policy(decider, r)) is not None]
                        per = []
                        for w in WORDINGS:
                            sel = [(r, o) for r, o in ran if r.wording == w]
                            per.append(rates([r for r, _ in sel], [o.flagged for _, o in sel]))
                        cost = (one_cpu + np.mean([o.look_cpu_s for _, o in ran])) / one_cpu
                        key = (lo, hi, yes, agree, para)
                        results.append((min(p[0] for p in per), min(p[1] for p in per), cost, key, len(ran)))
    print("tune, min over wordings: wrong flagged, correct passed, mean CPU cost vs one pass; (lo cov, hi cov, yes, agree, para)")
    ok = [r for r in results if r[1] >= 0.85 and r[2] <= 1.5]
    for r in sorted(ok, key=lambda r: (-r[0], r[2]))[:10]:
        print(f"  ok  {r[0]:.3f} {r[1]:.3f} {r[2]:.2f}x {r[3]} n={r[4]}")
    best: dict[float, Any] = {}
    for r in results:
        key = round(r[1], 2)
        if key not in best or r[0] > best[key][0]:
            best[key] = r
    for key in sorted(best, reverse=True)[:15]:
        r = best[key]
        print(f"  frontier passed {r[1]:.3f} flagged {r[0]:.3f} cost {r[2]:.2f}x {r[3]} n={r[4]}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="cascade", help="a shipped policy name or a policy file (its second_look settings)")
    p.add_argument("--greedy", default=GREEDY, help="the first-pass answers (eval ordinary's greedy cache)")
    p.add_argument("--cache", action="append", help="looks cache(s); measure appends to the first (default: one per look)")
    p.add_argument("--looks", default="self_check", help="looks to measure, comma-separated (self_check,sampling,paraphrase)")
    p.add_argument("--band", type=float, default=None, help="measure only answers whose guard_score is below this")
    p.add_argument("--until", default=None, help="HH:MM UTC: stop measuring then (waits for new first passes until then)")
    p.add_argument("--time-every", type=int, default=10, help="time a fresh first pass for every N-th answer (0: never)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--make-greedy", action="store_true", help="make --greedy: timed first passes of --questions tune questions")
    p.add_argument("--questions", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fit", action="store_true", help="search the cascade's thresholds on the tune half")
    args = p.parse_args(argv)
    policy = Policy.from_file(args.policy) if Path(args.policy).is_file() else Policy.named(args.policy)
    caches = args.cache or [
        *(f"/work/evalcache/second_look/smollm2-transformers-{look}.jsonl" for look in LOOKS),
        "/work/evalcache/second_look/smollm2-transformers-tune-self_check+sampling.jsonl",
    ]
    if args.make_greedy:
        make_greedy(args)
        return
    if not args.report_only:
        args.cache = (
            caches[0] if args.cache else f"/work/evalcache/second_look/smollm2-transformers-{args.looks.replace(',', '+')}.jsonl"
        )
        measure(args, policy)
        return
    from logtoku_guard.calibration.profiles import load_profile_for

    model = "smollm2-135m-instruct"
    rows = load_rows([Path(c) for c in caches], model)
    profile = load_profile_for(rows[0].generation.model if rows else model)
    if profile is None:
        raise SystemExit(f"no profile for {model}")
    rows = [replace(r, generation=replace(r.generation, model=profile.model)) for r in rows]
    if args.fit:
        fit(rows, policy, profile)
    for split in ("tune", "test"):
        print(report(rows, policy, profile, split))
        print()


if __name__ == "__main__":
    main()
