"""Joining a running batch on purpose: a gated tiny backend and a join at a chosen step."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.types import DecodingOptions, Generation
from support.gate import Gate
from support.same import wait_until
from support.tiny import make_model


def gated(
    tokenizer: Any, seed: int = 1, backend_kwargs: dict[str, Any] | None = None, **model_kwargs: Any
) -> tuple[TransformersBackend, Gate, Any]:
    model = make_model(tokenizer, seed=seed, **model_kwargs)
    model.register_forward_pre_hook(lambda module, args: time.sleep(0.002))
    return TransformersBackend("tiny", model_obj=model, tokenizer=tokenizer, **(backend_kwargs or {})), Gate(model), model


def queued(backend: TransformersBackend) -> int:
    return len(backend._batcher._queue)


def join_mid_generation(
    backend: TransformersBackend, gate: Gate, first: tuple[str, DecodingOptions], joiners: list[tuple[str, DecodingOptions]]
) -> list[Generation]:
    """Start ``first`` as a stream, read 3 tokens, then make ``joiners`` join its running batch at one step."""
    joins = backend._batcher.joins
    stream = backend.stream(*first)
    tokens = iter(stream)
    head = [next(tokens) for _ in range(3)]
    with ThreadPoolExecutor(len(joiners)) as pool:
        with gate.held():
            futures = [pool.submit(backend.generate, p, o) for p, o in joiners]
            wait_until(lambda: queued(backend) == len(joiners), "the joiners to queue")
        rest = list(tokens)
        results = [stream.generation, *(f.result(60) for f in futures)]
    assert backend._batcher.joins == joins + len(joiners)
    assert [t.id for t in head + rest] == [t.id for t in results[0].tokens]
    return results
