"""How :class:`~langchain_logtoku.LogTokUGuard` makes its generations: traced, never streamed as drafts.

:class:`TracedBackend` is the core backend protocol over a :class:`~langchain_logtoku.ChatLogTokU`:
it generates from the guard's core messages with the chat model's core backend, once, and hands
the :class:`~logtoku_guard.types.Generation` back as a value, while each generation is a child
chat-model run of the guard's run (started and ended as ``invoke`` does: tracers and callbacks
see its input, output and tags), tagged :data:`DRAFT_TAG`. A held backend (``live=False``, every
generation of ``invoke`` and of the buffered stream) also tags its runs :data:`NOSTREAM_TAG` and
reports no token to callbacks, so no stream consumer (``astream_events``, LangGraph
``stream_mode="messages"``) ever sees an answer the guard may withdraw; the core driver's
:class:`~logtoku_guard.guard.driver.Watch` still reads its tokens (through :meth:`TracedBackend.stream`)
and stops the generation when an ``early_stop`` rule fires. A live backend (``stream_mode="retract"``)
reports each token of :meth:`TracedBackend.stream` to callbacks as it comes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, LLMResult
from langchain_core.runnables import RunnableConfig

from langchain_logtoku import _convert
from langchain_logtoku._calls import CallSettings
from langchain_logtoku.chat_models import ChatLogTokU
from logtoku_guard.backends.base import TokenStream, provider_of
from logtoku_guard.scoring.uncertainty import EvidenceMode
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, Prompt, TokenScore, to_messages

__all__ = ["DRAFT_TAG", "NOSTREAM_TAG", "TracedBackend"]

DRAFT_TAG = "logtoku:draft"
"""The tag of every chat-model run the guard makes (its answer is a draft until the guard decides)."""
NOSTREAM_TAG = "nostream"
"""LangGraph's ``TAG_NOSTREAM``: ``stream_mode="messages"`` skips runs tagged with it."""


class TracedBackend:
    """The core backend protocol over the chat model: every generation a traced chat-model run.

    Decoding settings are the chat model's fields and the guard call's keywords (``llm_kwargs``);
    the core guard's own options are not used. ``generations``: every generation made, in order.
    """

    def __init__(self, llm: ChatLogTokU, config: RunnableConfig, llm_kwargs: Mapping[str, Any], *, live: bool = False) -> None:
        self.llm = llm
        self.config = config
        self.llm_kwargs = dict(llm_kwargs)
        self.live = live
        self.generations: list[Generation] = []

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

    @property
    def provider(self) -> str | None:
        """The chat model's core backend's provider (the spans' ``gen_ai.provider.name``)."""
        return provider_of(self.llm.core_backend)

    def _open(self, prompt: Prompt) -> tuple[CallbackManagerForLLMRun, CallSettings, list[ChatMessage]]:
        """A chat-model run for ``prompt``, the call's settings and the core prompt to generate from."""
        tags = [*self.config.get("tags", []), DRAFT_TAG, *(() if self.live else (NOSTREAM_TAG,))]
        messages = to_messages(prompt)
        run, call = self.llm.open_run(messages, {**self.config, "tags": tags}, self.llm_kwargs)
        return run, call, self.llm.core_prompt(messages, call)

    def _close(self, run: CallbackManagerForLLMRun, generation: Generation, call: CallSettings) -> Generation:
        generation = self.llm.finished(generation, call)
        run.on_llm_end(LLMResult(generations=[[ChatGeneration(message=self.llm.message_for(generation, call))]]))
        self.generations.append(generation)
        return generation

    def generate(self, prompt: Prompt, options: DecodingOptions | None = None) -> Generation:
        run, call, core_prompt = self._open(prompt)
        try:
            generation = self.llm.core_backend.generate(core_prompt, call.options)
        except BaseException as exc:
            run.on_llm_error(exc)
            raise
        return self._close(run, generation, call)

    def batch(self, prompts: Sequence[Prompt], options: DecodingOptions | None = None) -> list[Generation]:
        return [self.generate(p, options) for p in prompts]

    def stream(self, prompt: Prompt, options: DecodingOptions | None = None) -> TokenStream:
        """The generation token by token (each token reported to callbacks only when ``live``); closing
        the stream stops generating, and the run ends with what was generated."""
        run, call, core_prompt = self._open(prompt)
        try:
            inner = self.llm.core_backend.stream(core_prompt, call.options)
        except BaseException as exc:
            run.on_llm_error(exc)
            raise
        decode = _convert.decoder(self.llm.core_backend)
        failed: list[BaseException] = []

        def tokens() -> Iterator[TokenScore]:
            try:
                for core_token in inner:
                    token = self.llm.rescored(core_token, call)
                    if self.live:
                        meta = self.llm.token_metadata(token, call, decode)
                        chunk = ChatGenerationChunk(message=AIMessageChunk(content=token.text, response_metadata=meta))
                        run.on_llm_new_token(token.text, chunk=chunk)
                    yield token
            except Exception as exc:
                failed.append(exc)
                run.on_llm_error(exc)
                raise

        def result() -> Generation:
            inner.close()
            if failed:  # the run already ended with the error
                return self.llm.finished(inner.generation, call)
            return self._close(run, inner.generation, call)

        return TokenStream(tokens(), result, inner.close)
