"""Batching concurrent requests on one model: static micro-batches with early exit.

Every generation of a :class:`~logtoku_guard.backends.transformers.TransformersBackend`
(``generate``, ``batch``, ``stream``, from any number of threads or asyncio tasks via worker
threads) is a :class:`Job` submitted to the backend's :class:`Batcher`. One worker thread
takes the jobs waiting in the queue, merges the compatible ones (same decoding settings
except ``max_new_tokens`` and stop strings, which are per row) into one left-padded batch of
at most ``max_batch`` rows and runs it; a job whose rows end early (EOS, stop string, its own
token limit, cancelled) completes at once, its stream ends and its caller returns, while the
batch goes on for the others. Jobs that arrive while a batch runs wait for the next batch:
this is *static* micro-batching with early exit, not continuous batching (a new request does
not join a running batch between steps).

Seeded sampling runs alone (its random stream must not depend on other requests); every
other job may share a batch, which gives each row the same greedy tokens and AU/EU as alone
(left padding, attention mask and position ids from the mask; float differences ~1e-6).

The batcher is generic: the backend gives it a ``run(jobs)`` function that completes every
job's future. No torch import here.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from logtoku_guard.types import DecodingOptions, Generation, TokenScore

__all__ = ["DEFAULT_MAX_BATCH", "Batcher", "Job"]

DEFAULT_MAX_BATCH = 8
DEFAULT_WINDOW_S = 0.02
"""How long a batch that is not full waits, from its first request's arrival, for more: long
enough for requests sent together to meet, short against one decoding step of a real model."""
IDLE_EXIT_S = 2.0
"""The worker thread ends after this long without work (a new request starts it again)."""


@dataclass(eq=False)
class Job:
    """One request: ``rows`` prompts (prepared by the backend) generated with ``options``.

    ``on_token(row, token)`` streams each released token; ``cancel`` ends the job's rows after
    the current step. ``future`` gets the list of generations (one per row) or the error.
    """

    rows: list[Any]
    options: DecodingOptions
    on_token: Callable[[int, TokenScore], None] | None = None
    cancel: threading.Event | None = None
    future: Future[list[Generation]] = field(default_factory=Future)
    submitted: float = field(default_factory=time.monotonic)

    @property
    def exclusive(self) -> bool:
        """Seeded sampling: reproducible only alone."""
        return self.options.sampling and self.options.seed is not None

    def key(self) -> tuple[Any, ...]:
        """Jobs with equal keys can share one ``generate`` call."""
        o = self.options
        if not o.sampling:
            return ("greedy", o.dynamic)
        return ("sample", float(o.temperature), float(o.top_p), o.dynamic)


class Batcher:
    """Runs submitted jobs in batches on one worker thread.

    Args:
        run: runs one batch (a list of compatible jobs) and completes each job's future
            (result or exception), as early as each job's rows end.
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
        self._busy = False
        self._collected = True
        self.batches = 0
        """Batches run so far (for tests and benchmarks)."""
        self.largest = 0
        """Most rows seen in one batch."""

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

    def __call__(self, job: Job) -> list[Generation]:
        """Submit ``job`` and wait for its generations."""
        return self.submit(job).result()

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
            try:
                self._run(batch)
            except BaseException as exc:  # handed to every job of the batch still waiting
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)
            else:
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(RuntimeError("internal error: a batched job was not completed"))
            finally:
                self._busy = False

    def _take(self) -> list[Job] | None:
        """The next batch (called with the lock held); None after ``IDLE_EXIT_S`` without work."""
        deadline = time.monotonic() + IDLE_EXIT_S
        while not self._queue:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._cond.wait(left)
        head = self._queue[0]
        if not head.exclusive:
            # Requests sent together arrive a little apart: give a batch that is not full a moment.
            while self._rows(self._compatible(head)) < self.max_batch:
                left = head.submitted + self.window_s - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        batch = [head] if head.exclusive else self._compatible(head)
        for job in batch:
            self._queue.remove(job)
        self.batches += 1
        self.largest = max(self.largest, self._rows(batch))
        return batch

    def _compatible(self, head: Job) -> list[Job]:
        batch, rows, key = [head], len(head.rows), head.key()
        for job in self._queue[1:]:
            if job.exclusive or rows + len(job.rows) > self.max_batch or job.key() != key:
                continue
            batch.append(job)
            rows += len(job.rows)
        return batch

    @staticmethod
    def _rows(jobs: list[Job]) -> int:
        return sum(len(j.rows) for j in jobs)
