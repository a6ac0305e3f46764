"""Batching concurrent requests on one model: continuous batching.

Every generation of a :class:`~logtoku_guard.backends.transformers.TransformersBackend`
(``generate``, ``batch``, ``stream``, from any number of threads or asyncio tasks via worker
threads) is a :class:`Job` submitted to the backend's :class:`Batcher`. One worker thread
takes the jobs waiting in the queue (those arriving within ``window_s`` of the first are
taken together), merges the compatible ones (same decoding settings except
``max_new_tokens`` and stop strings, which are per row) into one batch of at most
``max_batch`` rows and hands it to the backend's ``run``. While that batch runs, ``run``
calls :meth:`Batcher.take_joiners` between decoding steps: compatible jobs queued meanwhile
*join* the running batch at the next step (the backend's decode loop,
:mod:`logtoku_guard.backends.decode_loop`, prefills them and merges their KV cache into the
running one), and a job whose rows end (EOS, stop string, its own token limit, cancelled,
an error) completes at once and *leaves* the batch, its rows removed from the batch tensors:
continuous batching, as in vLLM or TGI, at step granularity.

Joining is first come, first served: only the longest run of compatible jobs at the head of
the queue that fits the free rows joins, so a request with other settings (or too many rows)
is never overtaken forever: it waits until the running batch drains, then runs next. Every job
is compatible with every other but for a dynamic temperature schedule (:meth:`Job.key`):
greedy and sampled rows share a batch, each row sampled with its own temperature, top-p and
random stream (:func:`row_seed`: a seeded request draws the same tokens whatever runs beside it;
its draw, :func:`~logtoku_guard.backends.processors.draw`, shrugs off the ~1e-5 float differences
of a batched forward pass but at a tie), as vLLM samples per request; every
row gets the same greedy tokens and AU/EU as alone (left padding, attention mask and position
ids from the mask; float differences ~1e-6). Which admitted rows the model's cache can hold is
the decode loop's own decision (llama.cpp's shared KV cache:
:mod:`~logtoku_guard.backends.llamacpp_loop`).

The batcher is generic: the backend gives it a ``run(jobs)`` function that completes every
job's future. No torch import here.
"""

from __future__ import annotations

import atexit
import gc
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, TokenScore

if TYPE_CHECKING:
    from logtoku_guard.backends.prompt_scoring import QuestionSpan

__all__ = ["DEFAULT_MAX_BATCH", "Batcher", "Job", "PreparedRow", "row_seed"]

DEFAULT_MAX_BATCH = 8
DEFAULT_WINDOW_S = 0.02
"""How long a batch that is not full waits, from its first request's arrival, for more: long
enough for requests sent together to meet, short against one decoding step of a real model."""
IDLE_EXIT_S = 2.0
"""The worker thread ends after this long without work (a new request starts it again)."""
EXIT_JOIN_S = 30.0
"""At interpreter exit, how long to wait for a worker to finish the batch it is running."""

_LIVE: weakref.WeakSet[Batcher] = weakref.WeakSet()


@atexit.register
def _stop_workers() -> None:
    """Let every worker leave the model before the interpreter (and torch's C++ runtime) shuts down.

    A request completes as soon as its row ends, while its batch may still be inside the model's
    forward pass; a daemon thread frozen there at exit can abort the process ("terminate called
    without an active exception"). Runs before daemon threads are stopped.
    """
    for batcher in list(_LIVE):
        batcher.close(EXIT_JOIN_S)


@dataclass(frozen=True)
class PreparedRow:
    """One prompt ready to batch: its turns, prompt token ids and token limit."""

    messages: list[ChatMessage]
    ids: list[int]
    limit: int  # its max_new_tokens, clamped to the context window
    span: QuestionSpan | None = None  # the question's token positions in ids (None: no fast tokenizer)
    score_prompt: bool = True  # score the question's tokens at prefill (Generation.prompt_scores)
    grammar: Any = None  # the row's RowGrammar under a constraint (logtoku_guard.tools.grammar; None: free text)


@dataclass(eq=False)
class Job:
    """One request: ``rows`` prompts (each a :class:`PreparedRow`) generated with ``options``.

    ``on_token(row, token)`` streams each released token; ``cancel`` ends the job's rows after
    the current step. ``future`` gets the list of generations (one per row) or the error.
    """

    rows: list[Any]
    options: DecodingOptions
    on_token: Callable[[int, TokenScore], None] | None = None
    cancel: threading.Event | None = None
    future: Future[list[Generation]] = field(default_factory=Future)
    submitted: float = field(default_factory=time.monotonic)
    model_stop: tuple[str, ...] = ()
    """The model's own stop strings, beside ``options.stop`` (:mod:`~logtoku_guard.backends.stop_strings`)."""

    @property
    def abandoned(self) -> bool:
        """Its future already completed (a failed request) or its caller cancelled it: nothing more to generate."""
        return self.future.done() or (self.cancel is not None and self.cancel.is_set())

    def key(self) -> tuple[Any, ...]:
        """Jobs with equal keys can share one batch: all of them but those of another dynamic
        temperature schedule (its warper runs on the whole batch); temperature, top-p, seed,
        ``max_new_tokens``, stop strings and constraints are per row."""
        dynamic = self.options.dynamic
        return ("plain",) if dynamic is None else ("dynamic", dynamic)


def row_seed(seed: int | None, index: int) -> int | None:
    """The seed of row ``index`` of a request seeded with ``seed`` (None: unseeded).

    Row 0 gets ``seed`` itself; every further row of a multi-prompt request a seed of its own
    (the prompts of one ``batch`` call must not draw the same random stream), the same at
    every call: a row's samples depend on its request's seed and its own logits only.
    """
    if seed is None:
        return None
    return seed if index == 0 else (seed + index * 0x9E3779B97F4A7C15) % 2**64


class Batcher:
    """Runs submitted jobs in batches on one worker thread.

    Args:
        run: runs one batch (a list of compatible jobs) and completes each job's future
            (result or exception), as early as each job's rows end; between decoding steps
            it may call :meth:`take_joiners` to add the compatible jobs queued meanwhile.
        max_batch: most rows in one batch (a single job with more rows still runs, alone).
        window_s: how long a batch that is not full waits for more requests.
        name: the worker thread's name.
    """

    def __init__(
        self,
        run: Callable[[list[Job]], None],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        window_s: float = DEFAULT_WINDOW_S,
        name: str = "logtoku-batcher",
    ) -> None:
        if max_batch < 1:
            msg = f"max_batch must be at least 1, got {max_batch}"
            raise ValueError(msg)
        self._run = run
        self.max_batch = max_batch
        self.window_s = window_s
        self._name = name
        self._cond = threading.Condition()
        self._queue: list[Job] = []
        self._thread: threading.Thread | None = None
        self._running: list[Job] = []  # the jobs of the running batch, joiners included
        self._busy = False
        self._collected = True
        self._closing = False
        _LIVE.add(self)
        self.batches = 0
        """Batches started so far (for tests and benchmarks)."""
        self.joins = 0
        """Jobs that joined an already running batch."""
        self.largest = 0
        """Most rows seen at once in one batch."""

    @property
    def waiting(self) -> int:
        """Requests queued, not yet in the running batch."""
        with self._cond:
            return len(self._queue)

    @property
    def running_rows(self) -> int:
        """Rows in the running batch now (0 when idle)."""
        with self._cond:
            return self._rows(self._running) if self._busy else 0

    def submit(self, job: Job) -> Future[list[Generation]]:
        """Queue ``job``; its future completes when its rows end."""
        if self._busy and not self._collected:
            # An abandoned stream caught in a reference cycle cancels its generation only when
            # finalised: collect now rather than wait behind it (once per running batch with a
            # stream in it: a full collection takes a while with a large heap).
            self._collected = True
            gc.collect()
        with self._cond:
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return job.future

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued jobs, then stop the worker thread (a later ``submit`` starts a new one)."""
        with self._cond:
            self._closing = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._cond:
            self._closing = False

    def __call__(self, job: Job) -> list[Generation]:
        """Submit ``job`` and wait for its generations."""
        return self.submit(job).result()

    def take_joiners(self, live_rows: int) -> list[Job]:
        """Queued jobs that join the running batch now, which holds ``live_rows`` rows.

        Called by ``run`` (in the worker thread) between decoding steps (with ``live_rows == 0``
        once the batch has drained: the jobs taken then start a new batch). Takes the longest
        run of jobs at the head of the queue that share the running batch's settings and fit
        in ``max_batch - live_rows`` rows, so that no request is overtaken forever. The returned
        jobs are the batch's from now on: the worker fails them too if ``run`` raises.
        """
        with self._cond:
            if not self._running:
                return []
            key = self._running[0].key()
            rows = live_rows
            taken: list[Job] = []
            for job in self._queue:
                if job.key() != key or rows + len(job.rows) > self.max_batch:
                    break
                taken.append(job)
                rows += len(job.rows)
            if taken:
                del self._queue[: len(taken)]
                self._running.extend(taken)
                if live_rows:
                    self.joins += len(taken)
                else:  # the batch had drained: this starts a new one
                    self.batches += 1
                self.largest = max(self.largest, rows)
                if any(job.cancel is not None for job in taken):
                    self._collected = False
            return taken

    # -- the worker --------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                batch = self._take()
                if batch is None:
                    self._thread = None
                    return
                self._busy = True
                self._collected = not any(job.cancel is not None for job in batch)
                self._running = list(batch)
            try:
                self._run(batch)
            except BaseException as exc:  # handed to every job of the batch still waiting
                for job in self._jobs_run():
                    if not job.future.done():
                        job.future.set_exception(exc)
            else:
                for job in self._jobs_run():
                    if not job.future.done():
                        job.future.set_exception(RuntimeError("internal error: a batched job was not completed"))
            finally:
                self._busy = False

    def _jobs_run(self) -> list[Job]:
        """The jobs of the batch that just ended (joiners included), forgotten by the batcher."""
        with self._cond:
            jobs, self._running = self._running, []
        return jobs

    def _take(self) -> list[Job] | None:
        """The next batch (called with the lock held); None after ``IDLE_EXIT_S`` without work."""
        deadline = time.monotonic() + IDLE_EXIT_S
        while not self._queue:
            left = deadline - time.monotonic()
            if left <= 0 or self._closing:
                return None
            self._cond.wait(left)
        head = self._queue[0]
        # Requests sent together arrive a little apart: give a batch that is not full a moment.
        while self._rows(self._compatible(head)) < self.max_batch:
            left = head.submitted + self.window_s - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
        batch = self._compatible(head)
        for job in batch:
            self._queue.remove(job)
        self.batches += 1
        self.largest = max(self.largest, self._rows(batch))
        return batch

    def _compatible(self, head: Job) -> list[Job]:
        batch, rows, key = [head], len(head.rows), head.key()
        for job in self._queue[1:]:
            if rows + len(job.rows) > self.max_batch or job.key() != key:
                continue
            batch.append(job)
            rows += len(job.rows)
        return batch

    @staticmethod
    def _rows(jobs: list[Job]) -> int:
        return sum(len(j.rows) for j in jobs)


class JobRows:
    """What a decode loop shares with any other: the step recorder's two callbacks, which hand
    each token to its job's ``on_token`` and each ended row's Generation to its job, whose
    future completes once all of its rows have ended.

    The loop keeps ``live`` (its rows, each with ``job`` and ``index``), ``results`` (the
    finished rows of each job so far) and ``finish`` (a row to its Generation).
    """

    live: list[Any]
    results: dict[Job, dict[int, Generation]]
    finish: Callable[[Any], Generation]

    def _on_token(self, b: int, token: TokenScore) -> None:
        row = self.live[b]
        if row.job.on_token is not None and not row.job.future.done():
            row.job.on_token(row.index, token)

    def _on_row_done(self, b: int, state: Any) -> None:
        self._complete(self.live[b], state)

    def _complete(self, row: Any, state: Any) -> None:
        """``row`` ended with ``state``: its Generation (or error) goes to its job."""
        job = row.job
        if job.future.done():
            return
        if state.error is not None:
            job.future.set_exception(state.error)
            return
        done = self.results.setdefault(job, {})
        done[row.index] = self.finish(row)
        if len(done) == len(job.rows):
            del self.results[job]
            job.future.set_result([done[n] for n in range(len(job.rows))])
