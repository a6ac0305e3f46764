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
import itertools
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_eval.cache import slug
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
TUNE_GREEDY = "/work/evalcache/second_look/tune-greedy.jsonl"
DEFAULT_CACHES = (
    "/work/evalcache/second_look/smollm2-transformers-self_check.jsonl",
    "/work/evalcache/second_look/smollm2-transformers-sampling.jsonl",
    "/work/evalcache/second_look/smollm2-transformers-paraphrase.jsonl",
    "/work/evalcache/second_look/smollm2-transformers-tune-self_check+sampling.jsonl",
)


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


COLLECT = "/work/evalcache/second_look/smollm2-transformers-collect.jsonl"
COLLECT_LLAMACPP = "/work/evalcache/second_look/smollm2-llamacpp-collect.jsonl"
COLLECT_LOOKS: tuple[Look, ...] = ("self_check", "sampling", "paraphrase")


EVAL_CACHE_DIR = Path("/work/evalcache")
"""Where ``eval`` ran with ``--gen-cache-dir``: its first passes, as ``ask`` makes them."""
NAMED_COLLECT = {"smollm2-135m-instruct": COLLECT, "smollm2-135m-instruct@llamacpp": COLLECT_LLAMACPP}
"""The collect files made before ``--model``: the embedded model on transformers, and on llama.cpp's Q4_1."""


def measured_model(args: argparse.Namespace) -> str:
    """The name ``--backend`` records for ``--model`` (the llama.cpp weights included), found without loading it."""
    from logtoku_eval.cli.common import model_name

    return model_name(args.model, args.backend)


def _lines(path: Path) -> int:
    with path.open(encoding="utf-8") as f:
        return sum(1 for _ in f)


def eval_cache(model: str, dataset: str) -> Path:
    """``eval``'s cache of ``model``'s answers to ``dataset`` made as ``ask`` makes them (greedy, 64 tokens,
    the question alone): the file name the evaluation gives it (:attr:`~logtoku_eval.cache.CacheMeta.filename`)."""
    from logtoku_eval.cache import CachedGeneration, CacheMeta
    from logtoku_eval.generate import K_STORED, SERVING, SERVING_TEMPLATE

    return EVAL_CACHE_DIR / CacheMeta(model, dataset, K_STORED, SERVING.name, SERVING_TEMPLATE, CachedGeneration.kind).filename


def collect_file(args: argparse.Namespace) -> Path:
    """Where ``--collect`` appends its answers for ``--model`` on ``--backend`` (``--collect-out`` when given):
    one file per model name, so answers of other weights or models never mix."""
    if args.collect_out:
        return Path(args.collect_out)
    name = measured_model(args)
    if args.benchmark == "traffic":
        return Path(f"/work/evalcache/second_look/{slug(name)}-traffic-collect.jsonl")
    return Path(NAMED_COLLECT.get(name) or f"/work/evalcache/second_look/{slug(name)}-collect.jsonl")


def greedy_caches(args: argparse.Namespace) -> list[Path]:
    """First passes already made for the measured model: ``--greedy`` (and the tune draw's) on transformers'
    embedded model, ``eval ordinary``'s cache for any other."""
    name = measured_model(args)
    if name == "smollm2-135m-instruct":
        return [Path(args.greedy), Path(TUNE_GREEDY)]
    from logtoku_eval.ordinary import dataset_name

    return [eval_cache(name, dataset_name())]


def drawn_among(args: argparse.Namespace) -> str | None:
    """The first passes the test draw is made among (:func:`collect_order`): the model's ``eval ordinary`` cache
    when it has one, so none is made again (transformers, llama.cpp's F16); else every test question (its
    first passes are made by the collector: llama.cpp's Q4_1 draw, Gemma)."""
    name = measured_model(args)
    if name == "smollm2-135m-instruct":
        return str(args.greedy)
    if name == "smollm2-135m-instruct@llamacpp":
        return None
    cached = greedy_caches(args)[0]
    return str(cached) if cached.exists() else None


@dataclass(frozen=True)
class TrafficLookItem:
    """A test question of the realistic-traffic benchmark as the collector reads an item: its style
    (``cased``/``lower`` for a real question, its group for an invented one) stands for the wording."""

    question_item: Any  # the LabelledQuestion (outcome_of judges the answer against it)

    @property
    def id(self) -> str:
        return str(self.question_item.id)

    question_id = id

    @property
    def split(self) -> str:
        return str(self.question_item.split)

    @property
    def category(self) -> str:
        return f"{self.question_item.group}/{self.question_item.category}"

    @property
    def question(self) -> str:
        return str(self.question_item.question)

    @property
    def wording(self) -> str:
        from logtoku_eval.traffic_eval import STYLES

        q = self.question_item
        return STYLES.get(q.category, q.group) if q.group == "real" else str(q.group)

    def to_qa_item(self) -> Any:
        from logtoku_eval.datasets import QAItem

        q = self.question_item
        return QAItem(id=q.id, question=q.question, correct=q.answers, category=self.category)


def traffic_order(questions: int, seed: int) -> list[TrafficLookItem]:
    """``--benchmark traffic``: ``questions`` test questions of the realistic-traffic benchmark (with the made-up
    names), drawn with ``seed``: the real questions first (stratified by category), then the invented ones
    (each group stratified by category), so a partial collection measures the real answers first."""
    from logtoku_eval.traffic_eval import traffic_questions

    items = [TrafficLookItem(q) for q in traffic_questions() if q.split == "test"]
    groups = [[it for it in items if it.question_item.group == g] for g in ("real", "plausible", "syllable")]
    return [it for group in groups for it in _sample(group, questions, seed)][:questions]


def traffic_caches(args: argparse.Namespace) -> list[Path]:
    """``eval traffic``'s first passes of the measured model (the questions, the made-up names)."""
    from logtoku_eval.traffic import dataset_name

    name = measured_model(args)
    return [eval_cache(name, dataset_name()), eval_cache(name, TRAFFIC_SYLLABLE)]


def traffic_band(profile: Any) -> tuple[float, float]:
    """The widest band of guard_score any cascade of the report takes a look in: from the edge passing 95% of
    the guard's correct calibration answers to the one passing 30% (the shipped cascade's upper edge)."""
    from logtoku_guard.decision.conditions import Risk, risk_threshold_for

    lo, hi = (risk_threshold_for(Risk(coverage=c, confidence=0.9), profile.guard) for c in (0.95, 0.3))
    if lo is None or hi is None:
        raise SystemExit(f"{profile.model}'s guard places no threshold for coverage 0.95 or 0.3")
    return lo.threshold, hi.threshold


def collect_order(questions: int, seed: int, among_cached: str | None = GREEDY) -> list[Any]:
    """The answers ``--collect`` measures, in order: a random draw of questions by question (``seed``,
    stratified by category), two tune questions to one test question; with ``among_cached`` (transformers:
    ``eval ordinary``'s greedy cache) the test draw is among the questions whose first passes it holds, so
    no test first pass is made again; None: among every test question."""
    from logtoku_eval.ordinary import load_ordinary

    test_items = list(load_ordinary(split="test"))
    if among_cached is not None:
        with Path(among_cached).open(encoding="utf-8") as f:
            cached = {json.loads(line).get("id") for line in f}
        test_items = [it for it in test_items if it.id in cached]
    tune = _sample(load_ordinary(split="tune"), questions, seed)
    test = _sample(test_items, questions, seed)
    by_q: dict[str, list[Any]] = {}
    order: list[str] = []
    tq, eq = _chunks(tune), _chunks(test)
    mixed = [c for i in range(max(len(tq), len(eq))) for c in (*tq[2 * i : 2 * i + 2], *eq[i : i + 1])]
    for it in [x for c in mixed for x in c]:
        if it.question_id not in by_q:
            order.append(it.question_id)
        by_q.setdefault(it.question_id, []).append(it)
    return [it for q in order for it in by_q[q]]


def _chunks(items: Sequence[Any]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for it in items:
        if out and out[-1][0].question_id == it.question_id:
            out[-1].append(it)
        else:
            out.append([it])
    return out


def collect(args: argparse.Namespace, policy: Policy) -> None:
    """First pass (from ``--greedy`` when cached, else made now) and every look of ``--collect-looks`` for each
    answer of :func:`collect_order`, ``--workers`` answers at a time through one backend (their rows share its
    batches, so each look's CPU time is not separable: only tokens and wall seconds are recorded). Resumable."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from datetime import datetime, timezone

    from logtoku_eval.cache import CachedGeneration
    from logtoku_eval.fabricated_eval import generation_from_cached
    from logtoku_eval.generate import to_cached
    from logtoku_guard.backends.registry import create_backend
    from logtoku_guard.calibration.profiles import load_profile_for
    from logtoku_guard.calibration.self_labels import answer_matches, outcome_of

    traffic = args.benchmark == "traffic"
    out = collect_file(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    legacy = not traffic and measured_model(args) == "smollm2-135m-instruct"  # the looks measured before the collector
    wanted = tuple(args.collect_looks.split(","))
    taken: dict[str, set[str]] = {}  # looks already measured per answer, in any cache
    greedy: dict[str, Any] = {}
    for path in (out, *((Path(c) for c in DEFAULT_CACHES) if legacy else ())):
        if path.exists():
            with path.open(encoding="utf-8") as f:
                for d in map(json.loads, f):
                    taken.setdefault(d["id"], set()).update(m["look"] for m in d["looks"])
                    greedy.setdefault(d["id"], d["generation"])
    for path in traffic_caches(args) if traffic else greedy_caches(args):
        if path.exists():
            with path.open(encoding="utf-8") as f:
                greedy.update({d["id"]: d for d in map(json.loads, f) if "id" in d})
    order = (
        traffic_order(args.traffic_questions, args.seed)
        if traffic
        else collect_order(args.questions, args.seed, drawn_among(args))
    )
    todo = [it for it in order if set(wanted) - taken.get(it.id, set()) and (not traffic or it.id in greedy)]
    backend = create_backend(args.backend, model=args.model, device="cpu", max_batch=16)
    if backend.model_name != measured_model(args):
        raise SystemExit(f"the backend runs {backend.model_name!r}, not the {measured_model(args)!r} the files are named for")
    profile = load_profile_for(backend.model_name)
    scorer = Decider(default_policy(), profile)
    band = traffic_band(profile) if traffic else (-math.inf, math.inf)
    stop_at = None
    if args.until:
        hh, mm = (int(x) for x in args.until.split(":"))
        stop_at = datetime.now(timezone.utc).replace(hour=hh, minute=mm, second=0)
    lock = threading.Lock()

    def one(it: Any) -> None:
        if stop_at is not None and datetime.now(timezone.utc) >= stop_at:
            return
        messages = [ChatMessage("user", it.question)]
        first: dict[str, float] = {}
        if it.id in greedy:
            d = greedy[it.id]
            generation = generation_from_cached(CachedGeneration.from_json(d), backend.model_name)
        else:
            wall = time.perf_counter()
            made = backend.generate(messages, SERVING)
            first["seconds_shared"] = time.perf_counter() - wall
            d = to_cached(it.to_qa_item(), made).to_json()
            generation = generation_from_cached(CachedGeneration.from_json(d), backend.model_name)
        first["tokens"] = max(generation.prompt_tokens, len(generation.prompt_scores)) + len(generation.tokens)
        guard_score = scorer._stats(generation).guard_score
        if not band[0] <= guard_score < band[1]:  # traffic: no cascade takes a look here; its outcome needs none
            return
        io = BackendIO(backend, messages, policy.retrieve, options=SERVING)
        looks = []
        for look in wanted:
            if look in taken.get(it.id, set()):
                continue
            (m,) = io.measure(Measure((look,), it.question, generation, 1, policy.second_look)).measurements  # type: ignore[arg-type]
            looks.append({**_measurement_json(m), "cpu_s": None})
        line = {
            "id": it.id,
            "split": it.split,
            "wording": it.wording,
            "correct": bool(answer_matches(generation.text, it.answers)[0]) if not traffic else None,
            "outcome": outcome_of(it.question_item, generation.text) if traffic else None,
            "guard_score": guard_score,
            "first": first,
            "looks": looks,
            "generation": d,
        }
        with lock, out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    with ThreadPoolExecutor(args.workers) as pool:
        for future in [pool.submit(one, it) for it in todo]:
            future.result()


def time_alone(args: argparse.Namespace, policy: Policy) -> None:
    """Time ``--time-alone`` answers of ``--collect``'s draw one at a time (nothing else in the backend): a fresh
    first pass and each look, CPU seconds of this process. ``--collect`` shares batches between answers, so its
    own looks' CPU time is not separable; the report costs each look at the mean of these. Appends to the
    collect file's ``.timed.jsonl`` twin; the looks are taken on the collected first pass (the same inputs)."""
    from logtoku_eval.cache import CachedGeneration
    from logtoku_eval.fabricated_eval import generation_from_cached
    from logtoku_guard.backends.registry import create_backend

    source = collect_file(args)
    out = source.with_suffix(".timed.jsonl")
    done: set[str] = set()
    if out.exists():
        with out.open(encoding="utf-8") as f:
            done = {json.loads(line)["id"] for line in f}
    with source.open(encoding="utf-8") as f:
        collected = {d["id"]: d for d in map(json.loads, f) if "generation" in d}
    order = collect_order(args.questions, args.seed, drawn_among(args))
    todo = [it for it in order if it.id in collected and it.id not in done][: max(0, args.time_alone - len(done))]
    backend = create_backend(args.backend, model=args.model, device="cpu")
    backend.generate([ChatMessage("user", "Say hello.")], DecodingOptions(max_new_tokens=4))  # warm-up
    for it in todo:
        d = collected[it.id]
        messages = [ChatMessage("user", it.question)]
        wall, cpu = time.perf_counter(), time.process_time()
        backend.generate(messages, SERVING)
        first = {"seconds": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        generation = generation_from_cached(CachedGeneration.from_json(d["generation"]), backend.model_name)
        io = BackendIO(backend, messages, policy.retrieve, options=SERVING)
        looks = []
        for look in COLLECT_LOOKS:
            cpu = time.process_time()
            (m,) = io.measure(Measure((look,), it.question, generation, 1, policy.second_look)).measurements
            looks.append({**_measurement_json(m), "cpu_s": time.process_time() - cpu})
        line = {k: d[k] for k in ("id", "split", "wording", "correct", "guard_score", "generation")}
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps({**line, "first": first, "looks": looks}) + "\n")


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
    # --collect takes looks for several answers at once (rows share batches): their CPU time is not separable,
    # so each such look is costed at the mean CPU time of that look when it was timed alone
    # a look never timed alone (paraphrase) is costed by its tokens at the CPU seconds per token of the looks that were
    timed_all = [m for r in rows.values() for m in r.looks.values() if m.get("cpu_s") is not None and m["tokens"]]
    per_token = (
        float(np.sum([m["cpu_s"] for m in timed_all]) / np.sum([m["tokens"] for m in timed_all])) if timed_all else math.nan
    )
    for look in LOOKS:
        timed = [r.looks[look]["cpu_s"] for r in rows.values() if look in r.looks and r.looks[look].get("cpu_s") is not None]
        for r in rows.values():
            if look in r.looks and r.looks[look].get("cpu_s") is None:
                cpu = float(np.mean(timed)) if timed else per_token * float(r.looks[look]["tokens"])
                r.looks[look] = {**r.looks[look], "cpu_s": cpu, "cpu_estimated": "mean" if timed else "per token"}
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


# -- refit the guard with the second-look features (issue 41 item 3, third bullet) ---------------------
REFITS: dict[str, tuple[str, ...]] = {
    "guard_score alone": ("guard_score",),
    "+ sampling": ("guard_score", "sampling_agreement"),
    "+ sampling + self-check": ("guard_score", "sampling_agreement", "self_check_yes"),
    "+ paraphrase": ("guard_score", "paraphrase_agreement"),
    "+ sampling + paraphrase": ("guard_score", "sampling_agreement", "paraphrase_agreement"),
    "+ self-check": ("guard_score", "self_check_yes"),
}
"""The refits compared: a logistic regression of correctness on these statistics, fit on the tune answers
that reach the second look (guard_score inside the band); an undefined agreement counts as 0 (as a rule
reads it: the least reliable) and an undefined P(yes) as 0.5."""


@dataclass(frozen=True)
class Point:
    """One answer as the refit sees it."""

    row: Row
    guard_score: float
    values: dict[str, float]
    first_tokens: float
    look_tokens: dict[str, float]


def _points(rows: Sequence[Row], profile: Any) -> list[Point]:
    one = Decider(default_policy(), profile)
    out = []
    for r in rows:
        gs = one._stats(r.generation).guard_score
        vals = {"guard_score": gs}
        for stat, default in (("sampling_agreement", 0.0), ("self_check_yes", 0.5), ("paraphrase_agreement", 0.0)):
            v = r.value(stat)
            vals[stat] = v if math.isfinite(v) else default
        out.append(Point(r, gs, vals, float(r.first["tokens"]), {lk: float(m["tokens"]) for lk, m in r.looks.items()}))
    return out


class _Rows:
    """Refit features by name (``fit_guard`` reads rows through ``get``)."""

    def __init__(self, values: dict[str, float], reliability: float, n_tokens: int) -> None:
        self.values = values
        self.reliability = reliability  # fit_guard keeps the length fit of reliability
        self.n_tokens = n_tokens

    def get(self, name: str) -> float:
        return self.values[name]


def fit_refit(points: Sequence[Point], features: Sequence[str]) -> Any:
    from logtoku_guard.scoring.guard_score import fit_guard

    return fit_guard(
        [_Rows(p.values, p.row.generation.score.reliability, len(p.row.generation.tokens)) for p in points],  # type: ignore[misc]
        [p.row.correct for p in points],
        ["ordinary-tune second looks"],
        features=features,
        l2=1.0,
        folds=5,
    )


def _score(model: Any, p: Point) -> float:
    return float(model.predict([p.values[f] for f in model.features]))


LOOK_OF_FEATURE = {"sampling_agreement": "sampling", "self_check_yes": "self_check", "paraphrase_agreement": "paraphrase"}


def cascade_outcome(
    p: Point, lo: float, hi: float, model: Any, cut: float, look_cpu: dict[str, float], cpu1: float
) -> tuple[bool, bool, float, float]:
    """(flagged, took the looks, CPU cost vs one pass, tokens) of the refit cascade on one answer: flag below ``lo``;
    inside ``[lo, hi)`` take the looks of the refit's features and flag when its probability is below ``cut``; pass
    above. Each look is costed at its mean CPU seconds (``look_cpu``) and its own tokens."""
    if p.guard_score < lo:
        return True, False, 1.0, p.first_tokens
    if p.guard_score >= hi:
        return False, False, 1.0, p.first_tokens
    looks = [LOOK_OF_FEATURE[f] for f in model.features if f in LOOK_OF_FEATURE]
    cpu = cpu1 + sum(look_cpu[lk] for lk in looks)
    return _score(model, p) < cut, bool(looks), cpu / cpu1, p.first_tokens + sum(p.look_tokens.get(lk, math.nan) for lk in looks)


def drawn_prefix(
    points: dict[str, Point], split: str, questions: int, seed: int, among_cached: str | None = GREEDY
) -> list[Point]:
    """The answers of ``split`` in :func:`collect_order`'s seeded draw, question by question, up to the first
    question not fully measured: a random sample by question (stratified by category), whatever else is cached."""
    out: list[Point] = []
    for chunk in _chunks([it for it in collect_order(questions, seed, among_cached) if it.split == split]):
        if not all(it.id in points for it in chunk):
            break
        out += [points[it.id] for it in chunk]
    return out


def refit_report(
    rows: list[Row],
    profile: Any,
    sample_note: str,
    questions: int = 150,
    seed: int = 0,
    write_policy: str | None = None,
    among_cached: str | None = GREEDY,
    traffic: Sequence[Path] = (),
    traffic_looks: Path | None = None,
    traffic_draw: tuple[int, int] = (900, 0),
) -> str:
    """Fit each refit on the tune answers inside the band, choose the band and cut on tune, report the test half."""
    from logtoku_guard.decision.conditions import Risk, risk_threshold_for

    sampled = [r for r in rows if all(lk in r.looks for lk in LOOKS)]
    points = {r.id: p for r, p in zip(sampled, _points(sampled, profile))}
    cpu1, n_timed = one_pass_cpu(rows)
    n_timed_look = {lk: sum(1 for r in rows if lk in r.looks and not r.looks[lk].get("cpu_estimated")) for lk in LOOKS}
    look_cpu: dict[str, float] = {lk: float(np.mean([r.looks[lk]["cpu_s"] for r in sampled])) for lk in LOOKS}
    edges = {}
    for c in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95):
        chosen = risk_threshold_for(Risk(coverage=c, confidence=0.9), profile.guard)
        if chosen is not None and chosen.met:
            edges[c] = chosen.threshold
    tune = drawn_prefix(points, "tune", questions, seed, among_cached)
    test = drawn_prefix(points, "test", questions, seed, among_cached)
    header = [
        "| band (coverage of the edges: lo, hi) | refit | tune: in band n, AUROC in band (refit / guard_score) | cut | "
        "tune: wrong flagged / correct passed / cost | test: wrong flagged / correct passed / took the look / "
        "mean (p95) CPU cost / AUROC in band (refit / guard_score) |",
        "|---|---|---|---|---|---|",
    ]
    lines = [
        f"### Refit with the second-look features ({sample_note})",
        "",
        f"Answers with every look measured: tune {len(tune)} ({sum(p.row.correct for p in tune)} correct), "
        f"test {len(test)} ({sum(p.row.correct for p in test)} correct). One pass {cpu1:.2f} CPU s (n {n_timed} timed alone); "
        "each look, mean CPU s (n timed alone): "
        + ", ".join(f"{lk} {look_cpu[lk]:.2f} ({n_timed_look[lk]})" for lk in LOOKS)
        + " (a look never timed alone: its tokens at the timed looks' CPU seconds per token).",
        "",
        *header,
    ]
    best: list[tuple[float, Any, str]] = []
    for lo_c in (0.95, 0.9, 0.85, 0.8):
        for hi_c in (0.3, 0.4, 0.5, 0.6, 0.7):
            if lo_c not in edges or hi_c not in edges:
                continue
            lo, hi = edges[lo_c], edges[hi_c]
            band_tune = [p for p in tune if lo <= p.guard_score < hi]
            if sum(p.row.correct for p in band_tune) < 3 or sum(not p.row.correct for p in band_tune) < 3:
                continue
            for name, features in REFITS.items():
                model = fit_refit(band_tune, features)
                in_scores = [_score(model, p) for p in band_tune]
                for q in (0.1, 0.2, 0.3, 0.4, 0.5):
                    correct_in = sorted(s for s, p in zip(in_scores, band_tune) if p.row.correct)
                    cut = correct_in[min(len(correct_in) - 1, int(q * len(correct_in)))]
                    t_out = [cascade_outcome(p, lo, hi, model, cut, look_cpu, cpu1) for p in tune]
                    wf, cp, _, _ = rates([p.row for p in tune], [o[0] for o in t_out])
                    tcost = float(np.mean([o[2] for o in t_out]))
                    if cp < 0.85 or tcost > 1.5:
                        continue
                    e_out = [cascade_outcome(p, lo, hi, model, cut, look_cpu, cpu1) for p in test]
                    ewf, ecp, _, _ = rates([p.row for p in test], [o[0] for o in e_out])
                    band_test = [p for p in test if lo <= p.guard_score < hi]
                    a_refit = _auroc([p.row for p in band_test], [_score(model, p) for p in band_test])
                    a_gs = _auroc([p.row for p in band_test], [p.guard_score for p in band_test])
                    costs = [o[2] for o in e_out]
                    cell = (
                        f"| {lo_c}, {hi_c} ({lo:.3f}, {hi:.3f}) | {name} | {len(band_tune)}, "
                        f"{_pct(_auroc([p.row for p in band_tune], in_scores))} / "
                        f"{_pct(_auroc([p.row for p in band_tune], [p.guard_score for p in band_tune]))} | {cut:.3f} | "
                        f"{_pct(wf)} / {_pct(cp)} / {tcost:.2f}x | {_pct(ewf)} / {_pct(ecp)} / "
                        f"{_pct(float(np.mean([o[1] for o in e_out])))} / "
                        f"{np.mean(costs):.2f}x ({np.percentile(costs, 95):.2f}x) / "
                        f"{_pct(a_refit)} / {_pct(a_gs)} |"
                    )
                    best.append((wf, (lo, hi, model, cut, name, lo_c, hi_c), cell))
    alone_lines = []
    for split, part in (("tune", tune), ("test", test)):
        alone = []
        for stat in ("guard_score", "sampling_agreement", "paraphrase_agreement", "self_check_yes", "self_check_eu"):
            have = [p for p in part if stat == "guard_score" or math.isfinite(p.row.value(stat))]
            vals = [p.guard_score if stat == "guard_score" else reliable(stat, p.row.value(stat)) for p in have]
            alone.append(f"{stat} {_pct(_auroc([p.row for p in have], vals))} (n {len(have)})")
        alone_lines.append(f"Each statistic alone on the {split} draw, AUROC correct vs wrong: " + ", ".join(alone) + ".")
    frontier = []
    for stat in ("guard_score", "sampling_agreement", "paraphrase_agreement", "self_check_yes"):
        score = [
            p.guard_score
            if stat == "guard_score"
            else (reliable(stat, v) if math.isfinite(v := p.row.value(stat)) else -math.inf)
            for p in test
        ]
        correct = sorted(s for s, p in zip(score, test) if p.row.correct)
        wrong = [s for s, p in zip(score, test) if not p.row.correct]
        if correct and wrong:
            cut = correct[math.floor(0.15 * len(correct))]  # passes 85% of the draw's correct answers
            frontier.append(f"{stat} {_pct(float(np.mean([s < cut for s in wrong])))}")
    alone_lines.append(
        "Each statistic alone on the test draw, wrong answers flagged at the threshold passing 85% of its correct "
        "answers (read on the test draw itself: the best any threshold reaches, optimistic): " + ", ".join(frontier) + "."
    )
    lines[3:3] = ["", *alone_lines]
    best.sort(key=lambda b: -b[0])
    seen: set[str] = set()
    best = [b for b in best if not (b[2] in seen or seen.add(b[2]))]  # one row per distinct outcome
    lines += [c for _, _, c in best[:12]]
    firsts: dict[str, str] = {}
    for b in best:
        firsts.setdefault(b[1][4], b[2])
    lines += ["", "The best row of each refit (its frontier at >= 85% of tune's correct answers passed, <= 1.5x):", ""]
    lines += [*header, *firsts.values()]
    missing = [name for name in REFITS if name not in firsts]
    if missing:
        lines.append(f"No setting met the tune targets for: {', '.join(missing)}.")
    stated_best = next((b for b in best if b[1][4] == "+ sampling"), None)
    stated = None
    if stated_best is not None:
        try:
            stated = Policy.from_dict(piecewise_policy(stated_best[1], edges, Policy.named("cascade")))
        except ValueError as exc:
            lines += ["", f"The best '+ sampling' refit cannot be stated as rules: {exc}"]
        else:
            stated_dict = piecewise_policy(stated_best[1], edges, Policy.named("cascade"))
            lines += ["", "The best '+ sampling' refit as rules:", "```json", json.dumps(stated_dict["rules"]), "```"]
            if write_policy is not None:
                import yaml

                Path(write_policy).write_text(yaml.safe_dump(stated_dict, sort_keys=False), encoding="utf-8")
    if best:
        lines += ["", per_wording(test, rows, profile, best[0][1], look_cpu, cpu1, stated if best[0] is stated_best else None)]
        if stated_best is not None and stated_best is not best[0]:
            lines += ["", per_wording(test, rows, profile, stated_best[1], look_cpu, cpu1, stated)]
    if traffic:
        cascades = [("shipped cascade (sampling)", edges.get(0.9, math.nan), edges.get(0.3, math.nan), ("sampling",))]
        for b in firsts.values():
            lo, hi, model, _, name, lo_c, hi_c = next(x[1] for x in best if x[2] == b)
            looks = tuple(LOOK_OF_FEATURE[f] for f in model.features if f in LOOK_OF_FEATURE)
            cascades.append((f"refit {name}, band {lo_c}-{hi_c}", lo, hi, looks))
        lines += ["", traffic_cost(traffic, profile, cascades, look_cpu, cpu1)]
        if traffic_looks is not None and traffic_looks.exists():
            chosen = [next(x[1] for x in best if x[2] == b) for b in firsts.values()]
            lines += ["", traffic_outcomes(traffic, traffic_looks, profile, chosen, look_cpu, cpu1, traffic_draw)]
    lines.append("")
    lines.append(
        "Rows: the settings that pass >= 85% of tune's correct answers at <= 1.5x mean CPU, best tune wrong-flagged first."
    )
    return "\n".join(lines)


def traffic_outcomes(
    paths: Sequence[Path],
    looks_file: Path,
    profile: Any,
    chosen: Sequence[Any],
    look_cpu: dict[str, float],
    cpu1: float,
    draw: tuple[int, int],
) -> str:
    """The cascades on the realistic-traffic benchmark's test answers (``eval traffic``'s first passes in
    ``paths``), their looks from ``looks_file`` (``--collect --benchmark traffic``: taken only where an answer's
    guard_score is in :func:`traffic_band`, the only answers whose outcome a look can change): every answer of the
    collector's draw (``draw``: its ``--traffic-questions`` and ``--seed``) outside the band, and those in it whose
    looks were taken (the rest are counted as left out: the draw measures each group in a random order)."""
    from logtoku_eval.cache import CachedGeneration
    from logtoku_eval.fabricated_eval import generation_from_cached
    from logtoku_guard.calibration.self_labels import outcome_of

    cached: dict[str, dict[str, Any]] = {}
    for path in paths:
        with path.open(encoding="utf-8") as f:
            cached.update({d["id"]: d for d in map(json.loads, f) if "id" in d})
    looks: dict[str, dict[str, Any]] = {}
    with looks_file.open(encoding="utf-8") as f:
        for d in map(json.loads, f):
            looks.setdefault(d["id"], {}).update({m["look"]: m for m in d["looks"]})
    timed = {lk: {"cpu_s": look_cpu[lk]} for lk in LOOKS}
    lo_band, hi_band = traffic_band(profile)
    scorer = Decider(default_policy(), profile)
    rows: list[tuple[str, Row]] = []  # (outcome, row)
    unmeasured: dict[str, int] = {}
    for it in traffic_order(*draw):
        if it.id not in cached:
            continue
        rec = CachedGeneration.from_json(cached[it.id])
        g = generation_from_cached(rec, profile.model)
        taken = {lk: {**m, **timed[lk]} for lk, m in looks.get(it.id, {}).items()}
        outcome = outcome_of(it.question_item, rec.answer)
        if lo_band <= scorer._stats(g).guard_score < hi_band and set(LOOKS) - set(taken):
            unmeasured[outcome] = unmeasured.get(outcome, 0) + 1  # in the band, its looks not taken yet: left out
            continue
        first = {"tokens": float(max(g.prompt_tokens, len(g.prompt_scores)) + len(g.tokens))}
        rows.append((outcome, Row(it.id, "test", it.wording, outcome == "real-correct", g, first, taken)))
    points = _points([r for _, r in rows], profile)
    kinds = ("real-correct", "real-wrong", "plausible", "syllable")
    counts = {k: sum(1 for o, _ in rows if o == k) for k in kinds}
    header = (
        "| policy | real, cased: wrong flagged / correct passed | real, lower: wrong flagged / correct passed | "
        "all real: wrong flagged / correct passed | plausible flagged | syllable flagged | took a look | mean CPU vs one pass |"
    )
    out = [
        f"The cascades on realistic traffic: {len(rows)} test answers of the traffic benchmark drawn by question "
        f"(seed {draw[1]}, stratified by group and category; {', '.join(f'{k} {v}' for k, v in counts.items())}), "
        f"{sum(1 for _, r in rows if r.looks)} of them in the band [{lo_band:.3f}, {hi_band:.3f}) with every look taken; "
        f"left out, in the band but not measured yet: {', '.join(f'{k} {v}' for k, v in unmeasured.items()) or 'none'}.",
        "",
        header,
        "|---|---|---|---|---|---|---|---|",
    ]

    def line(name: str, flagged: Sequence[bool], took: Sequence[bool], cost: Sequence[float]) -> str:
        def share(kind: str, style: str | None, want: bool) -> str:
            sel = [f for (o, r), f in zip(rows, flagged) if o == kind and (style is None or r.wording == style)]
            return _pct(float(np.mean([f == want for f in sel]))) if sel else "n/a"

        cells = [f"{share('real-wrong', st, True)} / {share('real-correct', st, False)}" for st in ("cased", "lower", None)]
        return (
            f"| {name} | {' | '.join(cells)} | {share('plausible', None, True)} | {share('syllable', None, True)} | "
            f"{_pct(float(np.mean(took)))} | {np.mean(cost):.2f}x |"
        )

    one = Decider(default_policy(), profile)
    flags = [one.decide(r.generation).action != "pass" for _, r in rows]
    out.append(line("one pass, default policy", flags, [False] * len(rows), [1.0] * len(rows)))
    shipped = [run_policy(Decider(Policy.named("cascade"), profile), r) for _, r in rows]
    if all(o is not None for o in shipped):
        done = [o for o in shipped if o is not None]
        cost = [(cpu1 + o.look_cpu_s) / cpu1 for o in done]
        out.append(line("shipped cascade", [o.flagged for o in done], [bool(o.looks) for o in done], cost))
    for lo, hi, model, cut, name, lo_c, hi_c in chosen:
        res = [cascade_outcome(p, lo, hi, model, cut, look_cpu, cpu1) for p in points]
        out.append(line(f"refit {name}, band {lo_c}-{hi_c}", [r[0] for r in res], [r[1] for r in res], [r[2] for r in res]))
    return "\n".join(out)


TRAFFIC_SYLLABLE = "traffic-syllable"
"""The dataset name ``eval traffic`` gives its cache of the made-up names' answers (beside the questions')."""


def traffic_cost(
    paths: Sequence[Path],
    profile: Any,
    cascades: Sequence[tuple[str, float, float, tuple[str, ...]]],
    look_cpu: dict[str, float],
    cpu1: float,
) -> str:
    """What each cascade costs over realistic traffic: the realistic-traffic benchmark's test answers in ``paths``
    (``eval traffic``'s cache, as ``ask`` answers), scored by ``profile``'s guard; an answer whose guard_score falls
    in a cascade's band ``[lo, hi)`` pays its looks (each at its mean CPU seconds alone, ``look_cpu``), any other
    pays one pass. Only the guard_score decides who takes a look, so no look is taken here."""
    from logtoku_eval.cache import CachedGeneration
    from logtoku_eval.fabricated_eval import generation_from_cached
    from logtoku_eval.traffic_eval import traffic_questions
    from logtoku_guard.calibration.self_labels import outcome_of

    questions = {q.id: q for q in traffic_questions() if q.split == "test"}
    scorer = Decider(default_policy(), profile)
    scored: list[tuple[str, float]] = []  # (outcome, guard_score): real-correct, real-wrong, plausible, syllable
    for path in paths:
        with path.open(encoding="utf-8") as f:
            for d in map(json.loads, f):
                if d.get("id") in questions:
                    cached = CachedGeneration.from_json(d)
                    g = generation_from_cached(cached, profile.model)
                    scored.append((outcome_of(questions[d["id"]], cached.answer), scorer._stats(g).guard_score))
    if not scored:
        return f"Cost over realistic traffic: no test answer in {', '.join(map(str, paths))}."
    kinds = sorted({k for k, _ in scored})
    out = [
        f"Cost over realistic traffic: the traffic benchmark's {len(scored)} test answers in "
        f"{', '.join(f'`{p.name}`' for p in paths)}, scored by "
        f"{profile.model}'s guard ({', '.join(f'{k} {sum(1 for g, _ in scored if g == k)}' for k in kinds)}).",
        "",
        "| cascade | band (guard_score) | looks | took a look: all / " + " / ".join(kinds) + " | mean (p95) CPU vs one pass |",
        "|---|---|---|---|---|",
    ]
    for name, lo, hi, looks in cascades:
        inside = [lo <= gs < hi for _, gs in scored]
        costs = np.array([(cpu1 + sum(look_cpu[lk] for lk in looks)) / cpu1 if b else 1.0 for b in inside])
        by_kind = [_pct(float(np.mean([b for (g, _), b in zip(scored, inside) if g == k]))) for k in kinds]
        out.append(
            f"| {name} | [{lo:.3f}, {hi:.3f}) | {', '.join(looks)} | {_pct(float(np.mean(inside)))} / {' / '.join(by_kind)} | "
            f"{costs.mean():.2f}x ({np.percentile(costs, 95):.2f}x) |"
        )
    return "\n".join(out)


def piecewise_policy(chosen: Any, edges: dict[float, float], base: Policy) -> dict[str, Any]:
    """The refit cascade ("+ sampling") as rules the policy language states: the refit flags when
    ``sampling_agreement`` is below a cut that falls linearly as ``guard_score`` rises, so each sub-band
    of guard_score between the band's coverage edges gets the cut at its middle (cuts never rise with
    guard_score, so an earlier, stricter rule settles the lower sub-bands)."""
    _, _, model, cut, _, lo_c, hi_c = chosen
    if tuple(model.features) != ("guard_score", "sampling_agreement"):
        msg = f"only the guard_score + sampling_agreement refit is stated as rules, got {model.features}"
        raise ValueError(msg)
    (m_gs, m_ag), (s_gs, s_ag), (w_gs, w_ag) = model.means, model.stds, model.coef
    if w_ag <= 0:
        msg = "the refit does not rank higher agreement as more reliable: nothing to state"
        raise ValueError(msg)
    levels = sorted((c for c in edges if hi_c <= c <= lo_c), reverse=True)  # lo edge first (lowest guard_score)
    logit = math.log(cut / (1 - cut))
    rules: list[dict[str, Any]] = [
        {
            "name": "below-band",
            "when": {
                "stat": "guard_score",
                "op": "<",
                "value": {"coverage": lo_c, "confidence": 0.9},
                "fallback": "reliability",
                "fallback_value": {"quantile": lo_c},
            },
            "action": "retrieve",
        }
    ]
    previous = math.inf
    for a, b in itertools.pairwise(levels):
        mid = (edges[a] + edges[b]) / 2
        ag_cut = m_ag + s_ag / w_ag * (logit - model.intercept - w_gs * (mid - m_gs) / s_gs)
        ag_cut = round(min(previous, max(0.0, min(1.0, ag_cut))), 3)
        previous = ag_cut
        if ag_cut <= 0.0:
            continue
        band = {
            "stat": "guard_score",
            "op": "<",
            "value": {"coverage": b, "confidence": 0.9},
            "fallback": "reliability",
            "fallback_value": {"quantile": b},
        }
        rules.append(
            {
                "name": f"unstable-samples-below-c{b:g}",
                "when": {"all": [band, {"stat": "sampling_agreement", "op": "<", "value": ag_cut}]},
                "action": "retrieve",
            }
        )
    return {
        "name": "cascade",
        "rules": rules,
        "default_action": "pass",
        "retrieve": {"max_attempts": 1, "fallback": "abstain"},
        "second_look": base.second_look.model_dump(),
    }


def per_wording(
    test: Sequence[Point],
    rows: Sequence[Row],
    profile: Any,
    chosen: Any,
    look_cpu: dict[str, float],
    cpu1: float,
    stated: Policy | None,
) -> str:
    """The test answers per wording: one pass (default policy), the shipped cascade and the chosen refit cascade."""
    lo, hi, model, cut, name, lo_c, hi_c = chosen
    one = Decider(default_policy(), profile)
    shipped = Decider(Policy.named("cascade"), profile)
    out = [
        f"Test answers drawn (by question, seed 0) per wording; refit cascade: flag below the coverage-{lo_c} edge, sample "
        f"inside [coverage-{lo_c}, coverage-{hi_c}) and flag when the refit ({name}) is below {cut:.3f}.",
        "",
        "| wording | n correct/wrong | one pass: wrong flagged / correct passed / AUROC | shipped cascade: flagged / passed / "
        "took a look / mean CPU | refit cascade: flagged / passed / took a look / mean (p95) CPU vs one pass / "
        "tokens vs one pass | "
        "refit stated as rules, through the guard loop: flagged / passed / took a look |",
        "|---|---|---|---|---|---|",
    ]
    for wording in (*WORDINGS, "all"):
        part = [p for p in test if wording == "all" or p.row.wording == wording]
        if not part:
            continue
        prow = [p.row for p in part]
        wf, cp, nc, nw = rates(prow, [one.decide(r.generation).action != "pass" for r in prow])
        auc = _auroc(prow, [p.guard_score for p in part])
        v1 = [run_policy(shipped, r) for r in prow]
        ran = [(r, o) for r, o in zip(prow, v1) if o is not None]
        f1, p1, _, _ = rates([r for r, _ in ran], [o.flagged for _, o in ran])
        took1 = float(np.mean([bool(o.looks) for _, o in ran])) if ran else math.nan
        cost1 = float(np.mean([(cpu1 + o.look_cpu_s) / cpu1 for _, o in ran])) if ran else math.nan
        outs = [cascade_outcome(p, lo, hi, model, cut, look_cpu, cpu1) for p in part]
        f2, p2, _, _ = rates(prow, [o[0] for o in outs])
        costs = np.array([o[2] for o in outs])
        tokens = np.array([o[3] for o in outs]) / np.mean([p.first_tokens for p in part])
        cell = "n/a"
        if stated is not None:
            v2 = [run_policy(Decider(stated, profile), r) for r in prow]
            ran2 = [(r, o) for r, o in zip(prow, v2) if o is not None]
            f3, p3, _, _ = rates([r for r, _ in ran2], [o.flagged for _, o in ran2])
            cell = f"{_pct(f3)} / {_pct(p3)} / {_pct(float(np.mean([bool(o.looks) for _, o in ran2])))} (n {len(ran2)})"
        out.append(
            f"| {wording} | {nc}/{nw} | {_pct(wf)} / {_pct(cp)} / {_pct(auc)} | "
            f"{_pct(f1)} / {_pct(p1)} / {_pct(took1)} / {cost1:.2f}x | "
            f"{_pct(f2)} / {_pct(p2)} / {_pct(float(np.mean([o[1] for o in outs])))} / {costs.mean():.2f}x "
            f"({np.percentile(costs, 95):.2f}x) / {tokens.mean():.2f}x | {cell} |"
        )
    return "\n".join(out)


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
    p.add_argument("--refit", action="store_true", help="fit the refits on tune, report the test half")
    p.add_argument("--write-policy", default=None, help="--refit: write the best '+ sampling' refit stated as rules here")
    p.add_argument("--sample-note", default="the answers measured so far", help="--refit: what sample the report is on")
    p.add_argument("--collect", action="store_true", help="first pass and every look for --questions questions of each half")
    p.add_argument("--collect-out", default=None, help="where --collect appends its answers (default: one file per backend)")
    p.add_argument("--backend", choices=["transformers", "llamacpp"], default="transformers", help="the backend measured")
    p.add_argument(
        "--benchmark",
        choices=["ordinary", "traffic"],
        default="ordinary",
        help="--collect: the ordinary questions (tune and test), or the traffic benchmark's test answers in the looks' band",
    )
    p.add_argument("--traffic-questions", type=int, default=900, help="--benchmark traffic: questions drawn (all: 900)")
    p.add_argument("--traffic-cache", action="append", help="--refit: eval traffic's caches of first passes to cost cascades on")
    p.add_argument("--model", default="embedded", help="the model measured, as ask's --model (e.g. gemma3-270m on llamacpp)")
    p.add_argument("--collect-looks", default=",".join(COLLECT_LOOKS), help="--collect: the looks taken on each answer")
    p.add_argument("--time-alone", type=int, default=0, help="time N collected answers alone (first pass and each look)")
    p.add_argument("--workers", type=int, default=4, help="--collect: answers measured at once (their rows share batches)")
    args = p.parse_args(argv)
    policy = Policy.from_file(args.policy) if Path(args.policy).is_file() else Policy.named(args.policy)
    legacy = measured_model(args) == "smollm2-135m-instruct"
    collected = [*DEFAULT_CACHES, COLLECT] if legacy else [str(collect_file(args))]
    caches = args.cache or [*collected, str(Path(collected[-1]).with_suffix(".timed.jsonl"))]
    if args.make_greedy:
        make_greedy(args)
        return
    if args.time_alone:
        time_alone(args, policy)
        return
    if args.collect:
        collect(args, policy)
        return
    if not args.report_only:
        args.cache = (
            caches[0] if args.cache else f"/work/evalcache/second_look/smollm2-transformers-{args.looks.replace(',', '+')}.jsonl"
        )
        measure(args, policy)
        return
    from logtoku_guard.calibration.profiles import load_profile_for

    model = measured_model(args)
    rows = load_rows([Path(c) for c in caches], model)
    profile = load_profile_for(rows[0].generation.model if rows else model)
    if profile is None:
        raise SystemExit(f"no profile for {model}")
    rows = [replace(r, generation=replace(r.generation, model=profile.model)) for r in rows]
    if args.refit:
        given = args.traffic_cache or [str(p) for p in traffic_caches(args)]
        traffic = [Path(t) for t in given if Path(t).exists() and _lines(Path(t)) > 1]
        if not traffic:  # a cache holds its header line first
            print(f"(no traffic answers in {', '.join(given)}: give --traffic-cache for the cost over realistic traffic)")
        report_text = refit_report(
            rows,
            profile,
            args.sample_note,
            args.questions,
            args.seed,
            args.write_policy,
            drawn_among(args),
            traffic,
            collect_file(argparse.Namespace(**{**vars(args), "benchmark": "traffic", "collect_out": None})),
            (args.traffic_questions, args.seed),
        )
        print(report_text)
        return
    if args.fit:
        fit(rows, policy, profile)
    for split in ("tune", "test"):
        print(report(rows, policy, profile, split))
        print()


if __name__ == "__main__":
    main()
