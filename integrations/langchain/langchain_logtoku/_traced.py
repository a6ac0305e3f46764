"""How :class:`~langchain_logtoku.LogTokUGuard` makes its generations: traced, never streamed as drafts.

:class:`TracedBackend` is the core backend protocol over a :class:`~langchain_logtoku.ChatLogTokU`:
every generation is a child chat-model run of the guard's run, tagged :data:`DRAFT_TAG`.
Held drafts (every :meth:`~TracedBackend.generate`) are also tagged :data:`NOSTREAM_TAG` and made
with ``stream=False``, so no stream consumer (``astream_events``, LangGraph
``stream_mode="messages"``) ever sees an answer the guard may withdraw; tracers still see the
runs. The core driver's :class:`~logtoku_guard.driver.Watch` watches a held draft token by token
(through a capture) and stops its generation when an ``early_stop`` rule fires.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig

from langchain_logtoku import _convert
from langchain_logtoku.chat_models import ChatLogTokU
from logtoku_guard.backends.base import TokenStream
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.generation_capture import GenerationCapture, capture_generations
from logtoku_guard.types import DecodingOptions, Generation, Prompt, to_messages
from logtoku_guard.uncertainty import EvidenceMode

__all__ = ["DRAFT_TAG", "NOSTREAM_TAG", "TracedBackend"]

DRAFT_TAG = "logtoku:draft"
"""The tag of every chat-model run the guard makes (its answer is a draft until the guard decides)."""
NOSTREAM_TAG = "nostream"
"""LangGraph's ``TAG_NOSTREAM``: ``stream_mode="messages"`` skips runs tagged with it."""


class TracedBackend:
    """The core backend protocol over the chat model: every generation is a traced chat-model run.

    The core guard needs :class:`~logtoku_guard.types.Generation` objects (raw top-K logits
    included), which LangChain messages do not carry; the chat model hands them over through
    the core side channel (:mod:`logtoku_guard.generation_capture`) active around each call. Decoding settings are the chat
    model's fields and the guard call's keywords; the core guard's own options are not used.

    Drafts are never streamed to callbacks: :meth:`generate` calls the chat model with
    ``stream=False`` (no ``on_llm_new_token``, hence no ``on_chat_model_stream`` event, even under
    ``astream_events``) and tags the run ``logtoku:draft`` and ``nostream`` (so LangGraph's
    ``stream_mode="messages"`` does not send its final message either). Tracers still get the
    run's start and end. Only :meth:`stream`, used by ``stream_mode="retract"``, streams tokens
    (its run is tagged ``logtoku:draft`` only).
    """

    def __init__(self, llm: ChatLogTokU, config: RunnableConfig, llm_kwargs: Mapping[str, Any]) -> None:
        self.llm = llm
        self.config = config
        self.llm_kwargs = dict(llm_kwargs)
        self.generations: list[Generation] = []

    def _config(self, *tags: str) -> RunnableConfig:
        return {**self.config, "tags": [*self.config.get("tags", []), *tags]}

    @property
    def model_name(self) -> str:
        return self.llm.model_name

    @property
    def k(self) -> int:
        return self.llm.scoring_k

    @property
    def evidence(self) -> EvidenceMode:
        return cast(EvidenceMode, self.llm.scoring_evidence)

    @property
    def top_n(self) -> int:
        return self.llm.core_backend.top_n

    def _take(self, capture: GenerationCapture) -> Generation:
        generation = capture.take()
        if generation is None:
            msg = (
                "the chat model returned an answer without token scores (an LLM cache hit?); "
                "LogTokUGuard needs fresh generations: create the model with ChatLogTokU(cache=False)"
            )
            raise ConfigurationError(msg)
        self.generations.append(generation)
        return generation

    def generate(self, prompt: Prompt, options: DecodingOptions | None = None) -> Generation:
        messages = _convert.to_langchain_messages(to_messages(prompt))
        with capture_generations() as capture:
            self.llm.invoke(messages, config=self._config(DRAFT_TAG, NOSTREAM_TAG), stream=False, **self.llm_kwargs)
        return self._take(capture)

    def batch(self, prompts: Sequence[Prompt], options: DecodingOptions | None = None) -> list[Generation]:
        return [self.generate(p, options) for p in prompts]

    def stream(self, prompt: Prompt, options: DecodingOptions | None = None) -> TokenStream:
        messages = _convert.to_langchain_messages(to_messages(prompt))
        capture = GenerationCapture()
        chunks: Any = self.llm.stream(messages, config=self._config(DRAFT_TAG), **self.llm_kwargs)  # closed on cancel
        done = object()

        def step(fn: Any, *args: Any) -> Any:
            with capture_generations(capture):
                return fn(*args)

        def tokens() -> Iterator[Any]:
            seen = 0
            while True:
                chunk = step(next, chunks, done)
                live = capture.live_tokens
                yield from live[seen:]
                seen = len(live)
                if chunk is done:
                    return

        def cancel() -> None:
            if capture.cancel_stream():  # stop generating, then let the chat-model run end normally
                step(collections.deque, chunks, 0)
            else:  # the chat model is not generating: nothing to stop
                step(chunks.close)

        def result() -> Generation:
            step(chunks.close)
            return self._take(capture)

        return TokenStream(tokens(), result, cancel)
