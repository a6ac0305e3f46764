"""Batching concurrent requests: the Batcher's grouping and joining, and TransformersBackend rows that equal their solo runs.

No timed assertions: batches are formed deterministically by holding the worker (a blocked
job, or a running stream held inside a forward pass by :class:`support.gate.Gate`) while the
requests to batch are queued. Joining and leaving a running batch in depth:
``tests/backends/test_continuous_batching.py``.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support.gate import Forwards, Gate
from support.same import NEAR_TIE, assert_same, wait_until
from support.tiny import make_model

from logtoku_guard.backends.batching import Batcher, Job
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.types import DecodingOptions, DynamicTemperature, Generation

PROMPTS = [
    "What is the capital of France?",
    "Hi",
    "Count from one to ten, slowly, and then stop counting",
    "Tell me about Rome",
    "Uncertainty",
    "naïve café",
    "Retrieval augmented generation adds context",
    "Paris or Rome?",
]


# -- the Batcher on its own ------------------------------------------------------------------------
class Recorded:
    """A ``run`` for the Batcher that records its batches; the first one blocks until released."""

    def __init__(self) -> None:
        self.batches: list[list[Job]] = []
        self.release = threading.Event()

    def __call__(self, jobs: list[Job]) -> None:
        self.batches.append(jobs)
        if len(self.batches) == 1:
            self.release.wait(30)
        for job in jobs:
            job.future.set_result([])


def job(rows: int = 1, **options: Any) -> Job:
    return Job(list(range(rows)), DecodingOptions(**options))


def test_jobs_queued_while_a_batch_runs_form_the_next_batch() -> None:
    run = Recorded()
    batcher = Batcher(run, max_batch=4, window_s=0)
    first = batcher.submit(job())
    wait_until(lambda: len(run.batches) == 1, "the first batch")
    greedy = [batcher.submit(job(max_new_tokens=3 + i, stop=("x",) if i else ())) for i in range(5)]
    sampled = batcher.submit(job(temperature=0.7))
    seeded = [batcher.submit(job(temperature=0.7, seed=1)) for _ in range(2)]
    dynamic = batcher.submit(job(dynamic=DynamicTemperature(t_max=1.2, t_min=0.2)))
    big = batcher.submit(job(rows=6))
    run.release.set()
    for f in [first, *greedy, sampled, *seeded, dynamic, big]:
        assert f.result(30) == []
    sizes = [[len(j.rows) for j in b] for b in run.batches]
    options = [[j.options for j in b] for b in run.batches]
    # per-row max_new_tokens, stop strings, temperature and seed do not split a batch (greedy,
    # sampled and seeded rows share one); max_batch rows at most; another dynamic temperature
    # schedule does; a job larger than max_batch still runs (alone)
    assert sizes == [[1], [1, 1, 1, 1], [1, 1, 1, 1], [1], [6]]
    assert [o.sampling for o in options[2]] == [False, True, True, True] and options[2][2].seed == 1
    assert options[3][0].dynamic is not None
    assert batcher.largest == 6
    keys = [{j.key() for j in b} for b in run.batches]
    assert all(len(k) == 1 for k in keys)


def test_a_failing_batch_fails_each_of_its_jobs() -> None:
    def run(jobs: list[Job]) -> None:
        raise RuntimeError("boom")

    batcher = Batcher(run)
    with pytest.raises(RuntimeError, match="boom"):
        batcher(job())


class Joining:
    """A ``run`` that waits until released, takes the jobs that may join once, then completes them all."""

    def __init__(self) -> None:
        self.batcher: Batcher | None = None
        self.started: list[list[Job]] = []
        self.joined: list[list[Job]] = []
        self.release = threading.Event()

    def __call__(self, jobs: list[Job]) -> None:
        assert self.batcher is not None
        self.started.append(jobs)
        self.release.wait(30)
        taken = self.batcher.take_joiners(sum(len(j.rows) for j in jobs))
        self.joined.append(taken)
        for j in [*jobs, *taken]:
            j.future.set_result([])


def joining_batcher(max_batch: int = 4) -> tuple[Batcher, Joining]:
    run = Joining()
    run.batcher = Batcher(run, max_batch=max_batch, window_s=0)
    return run.batcher, run


def test_queued_compatible_jobs_join_the_running_batch_first_come_first_served() -> None:
    batcher, run = joining_batcher(max_batch=4)
    first = batcher.submit(job())
    wait_until(lambda: len(run.started) == 1, "the first batch")
    jobs = [job(max_new_tokens=5, stop=("x",)), job(rows=2), job(), job()]
    futures = [batcher.submit(j) for j in jobs]
    run.release.set()
    for f in [first, *futures]:
        assert f.result(30) == []
    # per-row settings do not matter; 1 + 1 + 2 rows fill max_batch: the fourth job and the one
    # behind it wait (nothing overtakes a job that does not fit) and form the next batch
    assert run.joined[0] == jobs[:2]
    assert run.started[1] == jobs[2:]
    assert batcher.joins == 2 and batcher.largest == 4 and batcher.batches == 2


def test_sampled_and_seeded_jobs_join_greedy_ones_and_another_schedule_is_not_overtaken() -> None:
    batcher, run = joining_batcher()
    first = batcher.submit(job())
    wait_until(lambda: len(run.started) == 1, "the first batch")
    sampled, seeded, greedy = job(temperature=0.7), job(temperature=0.7, seed=7), job()
    futures = [batcher.submit(sampled), batcher.submit(seeded), batcher.submit(greedy)]
    run.release.set()
    for f in [first, *futures]:
        assert f.result(30) == []
    assert run.joined[0] == [sampled, seeded, greedy] and batcher.joins == 3  # sampling is per row

    batcher, run = joining_batcher()
    first = batcher.submit(job())
    wait_until(lambda: len(run.started) == 1, "the first batch")
    dynamic, greedy = job(dynamic=DynamicTemperature(t_max=1.2, t_min=0.2)), job()
    futures = [batcher.submit(dynamic), batcher.submit(greedy)]
    run.release.set()
    for f in [first, *futures]:
        assert f.result(30) == []
    assert run.joined[0] == []  # the dynamic schedule heads the queue: the greedy job behind it waits too
    assert run.started[1:] == [[dynamic], [greedy]] and batcher.joins == 0


def test_a_failing_batch_fails_the_jobs_that_joined_it() -> None:
    release = threading.Event()
    batcher: Batcher

    def run(jobs: list[Job]) -> None:
        release.wait(30)
        assert batcher.take_joiners(1)
        raise RuntimeError("boom")

    batcher = Batcher(run, window_s=0)
    first = batcher.submit(job())
    wait_until(lambda: batcher._busy, "the first batch")
    joiner = batcher.submit(job())
    release.set()
    for f in (first, joiner):
        with pytest.raises(RuntimeError, match="boom"):
            f.result(30)


def test_max_batch_must_be_positive(tiny_tokenizer: Any) -> None:
    from logtoku_guard.errors import ConfigurationError

    with pytest.raises(ValueError, match="max_batch"):
        Batcher(lambda jobs: None, max_batch=0)
    with pytest.raises(ConfigurationError, match="max_batch"):
        TransformersBackend("tiny", model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer, max_batch=0)


# -- the backend ------------------------------------------------------------------------------------
def slow_backend(tokenizer: Any, seconds_per_step: float = 0.02, **kwargs: Any) -> tuple[TransformersBackend, Gate]:
    """A tiny model whose forward passes take a little while, and a gate to hold its worker."""
    model = make_model(tokenizer, seed=1)
    model.register_forward_pre_hook(lambda module, args: time.sleep(seconds_per_step))
    return TransformersBackend("tiny", model_obj=model, tokenizer=tokenizer, **kwargs), Gate(model)


def hold_worker(backend: TransformersBackend) -> Any:
    """A running stream (one token read) that keeps the worker generating until closed."""
    stream = backend.stream("hold", DecodingOptions(max_new_tokens=200))
    tokens = iter(stream)
    next(tokens)
    return stream, tokens


def queued(backend: TransformersBackend) -> int:
    return len(backend._batcher._queue)


OPTIONS = [
    DecodingOptions(max_new_tokens=12),
    DecodingOptions(max_new_tokens=3),
    DecodingOptions(max_new_tokens=20, stop=("e",)),
    DecodingOptions(max_new_tokens=7),
    DecodingOptions(max_new_tokens=16),
    DecodingOptions(max_new_tokens=1),
    DecodingOptions(max_new_tokens=9, stop=("is", "o")),
    DecodingOptions(max_new_tokens=25),
]


def test_concurrent_greedy_requests_join_the_running_batch_and_equal_their_solo_runs(tiny_tokenizer: Any) -> None:
    backend, gate = slow_backend(tiny_tokenizer, seconds_per_step=0.005)
    batcher = backend._batcher
    alone = [backend.generate(p, o) for p, o in zip(PROMPTS, OPTIONS)]
    before, joins = batcher.batches, batcher.joins
    stream, _ = hold_worker(backend)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        with gate.held():
            futures = [pool.submit(backend.generate, p, o) for p, o in zip(PROMPTS, OPTIONS)]
            wait_until(lambda: queued(backend) == len(PROMPTS), "the requests to queue")
        together = [f.result(60) for f in futures]
    stream.close()
    # no new batch: all eight joined the held stream's running batch (seven at once, the
    # eighth as soon as a row had left: max_batch is 8)
    assert batcher.batches == before + 1
    assert batcher.joins == joins + len(PROMPTS)
    assert batcher.largest == len(PROMPTS)
    for a, b in zip(alone, together):
        assert_same(a, b)
    assert {g.finish_reason for g in together} >= {"length", "stop"}
    assert stream.generation.finish_reason == "cancelled"


def test_backend_batch_equals_generate(tiny_backend: TransformersBackend) -> None:
    alone = [tiny_backend.generate(p, DecodingOptions(max_new_tokens=10)) for p in PROMPTS]
    for a, b in zip(alone, tiny_backend.batch(PROMPTS, DecodingOptions(max_new_tokens=10))):
        assert_same(a, b)


def test_a_request_that_ends_early_leaves_the_batch_at_once(tiny_tokenizer: Any) -> None:
    backend, gate = slow_backend(tiny_tokenizer)
    forwards = Forwards(backend.model)
    stream, _ = hold_worker(backend)
    with ThreadPoolExecutor(2) as pool:
        with gate.held():
            long = backend.stream(PROMPTS[0], DecodingOptions(max_new_tokens=200))
            short = pool.submit(backend.generate, PROMPTS[1], DecodingOptions(max_new_tokens=2))
            wait_until(lambda: queued(backend) == 2, "both requests to queue")
        g = short.result(60)  # returns while the long one, in the same batch, still generates
        assert len(g.tokens) == 2 and g.finish_reason == "length"
        mark = len(forwards.seen)
        read = list(zip(range(5), long))
        assert len(read) == 5
        assert backend._batcher.largest == 3
        # the short row was removed from the batch: the next steps feed 2 rows, and the KV cache holds 2
        steps = [f for f in forwards.seen[mark:] if f.new == 1]
        assert steps and all(f.rows == 2 and f.cached_rows == 2 for f in steps)
        assert any(f.rows == 3 and f.cached_rows == 3 for f in forwards.seen[:mark])
        long.close()
        assert long.generation.finish_reason == "cancelled" and len(long.generation.tokens) < 200
    stream.close()


def test_concurrent_streams_each_get_their_own_tokens(tiny_tokenizer: Any) -> None:
    backend, gate = slow_backend(tiny_tokenizer, seconds_per_step=0.005)
    alone = [backend.generate(p, o) for p, o in zip(PROMPTS[:4], OPTIONS[:4])]
    stream, _ = hold_worker(backend)

    def consume(i: int) -> tuple[list[Any], Generation]:
        s = backend.stream(PROMPTS[i], OPTIONS[i])
        return list(s), s.generation

    with ThreadPoolExecutor(4) as pool:
        with gate.held():
            futures = [pool.submit(consume, i) for i in range(4)]
            wait_until(lambda: queued(backend) == 4, "the streams to queue")
        for a, f in zip(alone, futures):
            tokens, g = f.result(60)
            assert_same(a, g)
            assert [t.id for t in tokens] == [t.id for t in a.tokens]
    stream.close()


def test_cancelling_one_stream_leaves_the_others_running(tiny_tokenizer: Any) -> None:
    backend, gate = slow_backend(tiny_tokenizer, seconds_per_step=0.005)
    other = backend.generate(PROMPTS[2], DecodingOptions(max_new_tokens=30))
    stream, _ = hold_worker(backend)
    with ThreadPoolExecutor(1) as pool:
        with gate.held():
            doomed = backend.stream(PROMPTS[0], DecodingOptions(max_new_tokens=200))
            survivor = pool.submit(backend.generate, PROMPTS[2], DecodingOptions(max_new_tokens=30))
            wait_until(lambda: queued(backend) == 2, "both requests to queue")
        stream.close()
        next(iter(doomed))
        doomed.close()
        assert doomed.generation.finish_reason == "cancelled"
        assert_same(other, survivor.result(60))


def test_asyncio_tasks_meet_in_the_batcher(tiny_tokenizer: Any) -> None:
    backend, gate = slow_backend(tiny_tokenizer, seconds_per_step=0.005)
    alone = [backend.generate(p, DecodingOptions(max_new_tokens=6)) for p in PROMPTS[:4]]
    stream, _ = hold_worker(backend)

    async def main() -> list[Generation]:
        with gate.held():
            tasks = [
                asyncio.create_task(asyncio.to_thread(backend.generate, p, DecodingOptions(max_new_tokens=6)))
                for p in PROMPTS[:4]
            ]
            await asyncio.to_thread(wait_until, lambda: queued(backend) == 4, "the tasks to queue")
        return list(await asyncio.gather(*tasks))

    for a, b in zip(alone, asyncio.run(main())):
        assert_same(a, b)
    stream.close()
    assert backend._batcher.largest == 5


def test_langchain_batch_uses_the_batcher(tiny_tokenizer: Any) -> None:
    pytest.importorskip("langchain_core")
    from langchain_logtoku import ChatLogTokU

    backend, gate = slow_backend(tiny_tokenizer, seconds_per_step=0.01)
    llm = ChatLogTokU(backend=backend, logtoku_profile=None, max_tokens=6)
    alone = [llm.invoke(p).content for p in PROMPTS[:4]]
    solo = [backend.generate(p, DecodingOptions(max_new_tokens=6)) for p in PROMPTS[:4]]
    assert [g.text for g in solo] == alone  # the chat model's invoke is the backend's generation
    # BaseChatModel.batch runs invoke in a thread pool: the calls meet in the batcher
    stream, _ = hold_worker(backend)
    with ThreadPoolExecutor(1) as pool:
        with gate.held():
            batched = pool.submit(llm.batch, PROMPTS[:4], config={"max_concurrency": 4})
            wait_until(lambda: queued(backend) == 4, "the batch's calls to queue")
        for got, want, generation in zip([m.content for m in batched.result(60)], alone, solo):
            # equal, unless the tiny model's answer passes a near tie that float differences may flip
            assert got == want or any(t.top_logits[0] - t.top_logits[1] < NEAR_TIE for t in generation.tokens), (got, want)
    stream.close()
    assert backend._batcher.largest == 5

    async def main() -> list[Any]:
        return await llm.abatch(PROMPTS[:4], config={"max_concurrency": 4})

    assert [m.content for m in asyncio.run(main())] == alone


def test_llamaindex_async_paths_run_concurrently(tiny_tokenizer: Any) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.llms.logtoku import LogTokULLM

    backend, gate = slow_backend(tiny_tokenizer, seconds_per_step=0.01)
    llm = LogTokULLM(backend=backend, max_new_tokens=6)
    alone = [llm.complete(p).text for p in PROMPTS[:4]]

    stream, _ = hold_worker(backend)

    async def main() -> list[str]:
        with gate.held():
            tasks = [asyncio.create_task(llm.acomplete(p)) for p in PROMPTS[:4]]
            await asyncio.to_thread(wait_until, lambda: queued(backend) == 4, "the tasks to queue")
        return [r.text for r in await asyncio.gather(*tasks)]

    assert asyncio.run(main()) == alone
    stream.close()
    assert backend._batcher.largest == 5


# -- the recorder's scoring: logsumexp and entropy from the top-K's maximum ---------------------------
def test_fused_logsumexp_entropy_matches_the_separate_passes() -> None:
    import torch

    from logtoku_guard.backends.recorder import lse_entropy
    from logtoku_guard.scoring.uncertainty import logsumexp_entropy

    torch.manual_seed(0)
    z = torch.randn(4, 5000) * 4
    z[2] = 0.0  # uniform: entropy log(V)
    z[3, 10:] = float("-inf")  # masked tokens: the fallback
    top = z.max(dim=-1).values
    lse, ent = lse_entropy(z, top.tolist())
    ref_lse, ref_ent = logsumexp_entropy(z.double())
    assert lse == pytest.approx(ref_lse.tolist(), abs=1e-4) and ent == pytest.approx(ref_ent.tolist(), abs=1e-4)
    assert ent[2] == pytest.approx(math.log(5000), abs=1e-4)


def test_logsumexp_entropy_reuses_one_scratch_buffer_with_the_same_results() -> None:
    import torch

    from logtoku_guard.backends.recorder import lse_entropy, scratch_for

    torch.manual_seed(1)
    z = torch.randn(3, 4000) * 6
    z[1] += 80.0  # a maximum beyond SHIFT_FREE: the shifted exponential, for every row
    for rows in (z, z[::2]):
        top = rows.max(dim=-1).values.tolist()
        scratch = scratch_for(None, rows)
        assert scratch_for(scratch, rows) is scratch  # a decoding loop keeps one buffer
        assert scratch_for(scratch, rows[:1]) is not scratch  # a batch of another size gets its own
        assert lse_entropy(rows, top, scratch) == lse_entropy(rows, top)
        half = [t * 0.5 for t in top]
        assert lse_entropy(rows * 0.5, half, scratch) == lse_entropy(rows * 0.5, half)  # old contents do not leak in


@pytest.mark.parametrize(("vocab", "k"), [(400, 2), (5000, 2), (5003, 5), (49152, 20), (300, 3), (100, 2)])
def test_chunked_top_k_equals_torch_topk(vocab: int, k: int) -> None:
    import torch

    from logtoku_guard.backends.recorder import top_k

    torch.manual_seed(vocab)
    z = torch.randn(3, vocab) * 5
    z[1, -1] = 100.0  # the maximum in the vocabulary's tail
    z[2, :] = -2.0
    z[2, [7, vocab - 2]] = 3.0  # two equal maxima
    values, ids = top_k(z, k)
    ref_values, ref_ids = z.topk(k, dim=-1)
    assert values == ref_values.tolist()
    assert ids[:2] == ref_ids[:2].tolist()
    assert set(ids[2][:2]) == {7, vocab - 2}
    assert z.gather(1, torch.tensor(ids)).tolist() == values


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("vocab", [49152, 5003])
def test_step_scores_equal_the_straightforward_reference(batch: int, vocab: int) -> None:
    """top_k, lse_entropy and the recorder's logprob against torch.topk, logsumexp, softmax entropy, log_softmax."""
    import torch

    from logtoku_guard.backends.recorder import SHIFT_FREE, StepRecorder, lse_entropy, scratch_for, top_k

    torch.manual_seed(batch * vocab)
    z = torch.randn(batch, vocab) * 3 + torch.linspace(-10, 30, batch)[:, None]
    z[0, 11] = z[0, 99] = z[0].max() + 1  # tied maxima
    z[-1, 5:9] = z[-1].max() + 2  # four tied maxima at the top of the last row
    if batch > 1:
        z[1] = z[1].round()  # many ties everywhere
        z[2] += 2 * SHIFT_FREE  # beyond the unshifted range
        z[3] -= 2 * SHIFT_FREE
    k = 20
    values, ids = top_k(z, k)
    ref_values, _ = z.topk(k, dim=-1)
    assert values == ref_values.tolist()  # the same values, exactly
    for b in range(batch):
        assert len(set(ids[b])) == k and z[b, ids[b]].tolist() == values[b]  # ids of those values (ties: any of the equal ones)
    lse, ent = lse_entropy(z, [v[0] for v in values], scratch_for(None, z))
    z64 = z.double()
    ref_lse = torch.logsumexp(z64, dim=-1)
    p = torch.softmax(z64, dim=-1)
    ref_ent = -(p * torch.log_softmax(z64, dim=-1)).sum(dim=-1)
    assert lse == pytest.approx(ref_lse.tolist(), rel=1e-6)
    assert ent == pytest.approx(ref_ent.tolist(), rel=1e-4, abs=1e-5)  # float32 sums: the error of lse - d/s

    # The criterion's logprob: the chosen logit from the top ids when it is there, else from the row.
    class Tok:
        def decode(self, ids: list[int], **kwargs: object) -> str:
            return "".join(f"<{i}>" for i in ids)

    for chosen in (z.argmax(dim=-1), torch.randint(0, vocab, (batch,))):
        rec = StepRecorder(
            k=2, evidence="clamped", tokenizer=Tok(), rows=batch, stop=(), eos_ids=frozenset(), on_token=None, cancel=None
        )
        rec.record(z)
        done = rec(chosen[:, None])
        assert done.tolist() == [False] * batch
        got = [rec.finish_row(b).tokens[0].logprob for b in range(batch)]
        ref = torch.log_softmax(z64, dim=-1).gather(1, chosen[:, None]).squeeze(1)
        assert got == pytest.approx(ref.tolist(), rel=1e-5, abs=1e-5)


def test_masked_and_non_finite_rows_fall_back_or_fail_as_before() -> None:
    import torch

    from logtoku_guard.backends.recorder import Row, StepRecorder, lse_entropy, top_k
    from logtoku_guard.errors import NonFiniteLogitsError
    from logtoku_guard.scoring.uncertainty import logsumexp_entropy

    torch.manual_seed(3)
    z = torch.randn(8, 5000) * 4
    z[1, 100:] = float("-inf")  # masked entries: every row falls back to the exact function
    lse, ent = lse_entropy(z, z.max(dim=-1).values.tolist())
    ref = logsumexp_entropy(z)
    assert lse == ref[0].tolist() and ent == ref[1].tolist()
    z[4, 3] = float("nan")
    values, _ = top_k(z, 2)
    assert math.isnan(values[4][0])  # NaN sorts first, as in torch.topk

    class Tok:
        def decode(self, ids: list[int], **kwargs: object) -> str:
            return "x"

    def recorder(on_row_done: Callable[[int, Row], None] | None = None) -> StepRecorder:
        return StepRecorder(
            k=2,
            evidence="clamped",
            tokenizer=Tok(),
            rows=8,
            stop=(),
            eos_ids=frozenset(),
            on_token=None,
            cancel=None,
            on_row_done=on_row_done,
        )

    rec = recorder()
    rec.record(z)
    with pytest.raises(NonFiniteLogitsError):
        rec(z.argmax(dim=-1)[:, None])
    ended: list[int] = []
    rec = recorder(on_row_done=lambda b, row: ended.append(b))
    rec.record(z)
    done = rec(torch.zeros(8, 1, dtype=torch.long))
    assert ended == [4] and done.tolist() == [b == 4 for b in range(8)]
    assert isinstance(rec.rows[4].error, NonFiniteLogitsError) and len(rec.rows[0].tokens) == 1


def test_the_one_au_eu_equals_the_formula_on_torch_digamma() -> None:
    """:func:`au_eu` (numpy, its own digamma) against the spec's formula written here on torch's digamma,
    in both evidence modes: positive, negative (raw: the reflection below 1/2), zero and invalid rows."""
    import torch

    from logtoku_guard.scoring.uncertainty import au_eu, token_logtoku

    torch.manual_seed(1)
    rows = torch.cat([torch.randn(200, 5) * 6, torch.zeros(1, 5), torch.tensor([[30.0, -1, -2, -3, -4]])]).double()
    rows = torch.cat([rows, torch.rand(50, 5).double() * 0.01, -0.95 * torch.rand(50, 5).double()])
    psi = torch.special.digamma
    for mode in ("clamped", "raw"):
        alpha = rows.clamp_min(0.0) if mode == "clamped" else rows
        a0 = alpha.sum(-1, keepdim=True)
        want = -((alpha / a0) * (psi(alpha + 1) - psi(a0 + 1))).sum(-1)
        if mode == "clamped":
            want = torch.where(a0[:, 0] > 0, want, torch.zeros_like(want)).clamp_min(0.0)
        else:
            want = torch.where((rows <= -1).any(-1), torch.full_like(want, math.nan), want)
        au, eu = au_eu(rows.numpy(), mode)  # type: ignore[arg-type]
        assert torch.allclose(torch.from_numpy(au), want, rtol=1e-10, atol=1e-11, equal_nan=True)
        assert torch.allclose(torch.from_numpy(eu), 5 / (rows.clamp_min(0.0) + 1).sum(-1), rtol=0, atol=1e-15)
        lists = token_logtoku(rows.tolist(), mode)  # type: ignore[arg-type]
        assert torch.allclose(torch.tensor(lists[0], dtype=torch.float64), want, rtol=1e-10, atol=1e-11, equal_nan=True)
    assert all(map(math.isnan, token_logtoku([[float("nan"), 1.0], [math.inf, 1.0]])[0]))
    assert all(map(math.isnan, token_logtoku([[float("nan"), 1.0], [math.inf, 1.0]])[1]))
    assert token_logtoku([]) == ([], [])


def test_close_waits_for_the_running_batch_then_stops_the_worker() -> None:
    """At exit the worker must leave the model first: a job completes while its batch still runs."""
    finished = threading.Event()

    def run(jobs: list[Job]) -> None:
        for j in jobs:
            j.future.set_result([])  # the request is answered...
        time.sleep(0.2)  # ...while the batch is still in the model
        finished.set()

    batcher = Batcher(run, window_s=0)
    assert batcher(job()) == []
    worker = batcher._thread
    assert worker is not None and worker.is_alive()
    batcher.close(timeout=10)
    assert finished.is_set() and not worker.is_alive()
    assert batcher(job()) == []  # a later request starts a new worker
    batcher.close(timeout=10)


def test_the_exit_hook_stops_every_live_worker() -> None:
    code = (
        "import time\n"
        "from logtoku_guard.backends.batching import Batcher, Job\n"
        "from logtoku_guard.types import DecodingOptions\n"
        "def run(jobs):\n"
        "    for j in jobs: j.future.set_result([])\n"
        "    time.sleep(0.5)\n"
        "    print('batch done', flush=True)\n"
        "b = Batcher(run, window_s=0)\n"
        "print(b(Job([0], DecodingOptions())), flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "batch", "done"]  # the interpreter waited for the batch to leave the model
