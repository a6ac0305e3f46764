"""``LogTokULLM``: a LlamaIndex LLM whose every token carries its LogTokU scores.

It runs a :mod:`logtoku_guard` backend (the embedded SmolLM2 model by default, loaded on first
use; or any :class:`~logtoku_guard.backends.base.Backend`, e.g. ``ScriptedBackend`` in tests).
Every response carries, in ``additional_kwargs["logtoku"]``, the core payloads
(:mod:`logtoku_guard.wire.payloads`)::

    {"tokens": [TokenPayload, ...],   # index, token, id, au, eu, quadrant, logprob, entropy, top_logits
     "summary": SummaryPayload}       # model, reliability*, quadrant_shares, n_tokens, finish_reason, k,
                                      # evidence, top_n, prompt_tokens, stop_sequence, thresholds, timings

``au``/``eu``: higher = more uncertain; ``reliability*``: higher = more reliable; NaN is
written as ``None``. ``raw`` is the typed :class:`~logtoku_guard.types.Generation`.
Streamed chunks carry their own token(s) under ``"tokens"``; the summary (and the full
message) comes on the last chunk only, so each chunk is held back until the next token exists.

Because query engines drop response metadata (``llm.predict()`` returns a string), every
finished generation is also handed to the active :func:`~logtoku_guard.guard.generation_capture.capture_generations` blocks.
While a :class:`~llama_index.llms.logtoku.withheld.WithheldCapture` is active (a guard holds the
answer back until it has decided), ``stream()``/``astream()`` generate the whole answer first
(``predict()``) and yield it as one piece: no in-progress event carries the draft.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from contextlib import closing
from typing import Any, TypedDict

from llama_index.core.base.llms.generic_utils import chat_response_to_completion_response
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    LogProb,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import LLM
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import TokenAsyncGen, TokenGen

from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError, InvalidPromptError
from logtoku_guard.guard.generation_capture import GenerationCapture, active_captures
from logtoku_guard.types import ChatMessage as CoreMessage
from logtoku_guard.types import DecodingOptions, Generation, TokenScore
from logtoku_guard.wire.payloads import SummaryPayload, TokenPayload
from logtoku_guard.wire.payloads import summary_payload as _summary_payload
from logtoku_guard.wire.payloads import token_payload as _token_payload

from .withheld import withheld

logger = logging.getLogger(__name__)

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "chatbot": "assistant",
    "model": "assistant",
}
_OPTION_KWARGS = ("max_new_tokens", "temperature", "top_p", "seed", "stop", "dynamic")
_END = object()


class _LogTokUKwargs(TypedDict, total=False):
    """``additional_kwargs["logtoku"]``: the tokens (one per streamed chunk) and, once, the summary."""

    tokens: list[TokenPayload]
    summary: SummaryPayload


def token_payload(token: TokenScore) -> TokenPayload:
    """One token's JSON-ready scores (:func:`logtoku_guard.wire.payloads.token_payload`, no quadrant thresholds)."""
    return _token_payload(token)


def summary_payload(generation: Generation) -> SummaryPayload:
    """The response-level summary of one generation (:func:`logtoku_guard.wire.payloads.summary_payload`)."""
    return _summary_payload(generation)


def _logprobs(tokens: Sequence[TokenScore], n: int = 0, decode: Any = None) -> list[list[LogProb]]:
    """Per token: the chosen token, then (``n`` > 0) its likeliest alternatives from the stored raw logits
    (``n`` entries in all; per call ``top_logprobs=n``, on whole responses: streamed chunks carry the chosen token)."""

    def one(t: TokenScore) -> list[LogProb]:
        alts = [(decode(i) if decode is not None else f"<id {i}>", lp) for i, lp in t.top_logprobs(n) if i != t.id]
        items = [(t.text, t.logprob), *alts][: max(n, 1)]
        return [LogProb(token=text, logprob=lp, bytes=list(text.encode("utf-8"))) for text, lp in items]

    return [one(t) for t in tokens]


def to_core_messages(messages: Sequence[ChatMessage]) -> list[CoreMessage]:
    """LlamaIndex chat messages -> core chat turns (system/developer, user, assistant/chatbot/model)."""
    out = []
    for i, m in enumerate(messages):
        role = m.role.value if isinstance(m.role, MessageRole) else str(m.role)
        if role not in _ROLES:
            msg = (
                f"message {i} has role {role!r}; LogTokULLM sends only system, user and assistant turns "
                "(no tool or function calling): turn tool output into a user message"
            )
            raise InvalidPromptError(msg)
        out.append(CoreMessage(_ROLES[role], m.content or ""))  # type: ignore[arg-type]
    return out


class LogTokULLM(LLM):
    """A local LLM scored with LogTokU (aleatoric AU, epistemic EU) on every generated token.

    Args:
        backend: an existing :class:`~logtoku_guard.backends.base.Backend` (a
            ``TransformersBackend``, or ``ScriptedBackend`` for tests). Default: a
            ``TransformersBackend(model, k=k, device=device, cache_dir=cache_dir)`` built on
            first use.
        model: for the default backend: ``None`` (the embedded SmolLM2-135M-Instruct), a local
            transformers folder, a ``.gguf`` file or a hub id already in the local cache.
        max_new_tokens, temperature (0 = greedy), top_p, seed, stop: decoding defaults; each
            call may override them with keyword arguments of the same names.
        context_window: reported in ``metadata``; default: the backend's own, else 3900.

    Chat and completion, their streaming and async forms, all go through the backend's chat
    template: ``complete(prompt)`` sends ``prompt`` as one user turn (after a system turn when
    ``system_prompt`` is set and ``formatted`` is false).
    """

    model: str | None = Field(default=None, description="Model for the default backend (None = embedded SmolLM2).")
    max_new_tokens: int = Field(default=256, description="Most tokens generated per call.")
    temperature: float = Field(default=0.0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(default=1.0, description="Nucleus sampling mass in (0, 1].")
    seed: int | None = Field(default=None, description="Sampling seed.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    k: int = Field(default=2, description="Top-K logits per token for LogTokU (default backend only).")
    device: str = Field(default="auto", description="Device of the default backend.")
    cache_dir: str | None = Field(default=None, description="Model cache of the default backend.")
    context_window: int | None = Field(default=None, description="Context window reported in metadata.")

    _backend: Backend | None = PrivateAttr(default=None)
    _backend_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _options: DecodingOptions = PrivateAttr()

    def __init__(self, backend: Backend | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if backend is not None and not isinstance(backend, Backend):
            msg = (
                f"backend must be a logtoku_guard Backend (generate/stream/batch, model_name, k), "
                f"got {type(backend).__name__}: {backend!r:.80}; pass e.g. TransformersBackend() or ScriptedBackend(...)"
            )
            raise ConfigurationError(msg)
        if self.context_window is not None and (isinstance(self.context_window, bool) or self.context_window < 1):
            msg = f"context_window must be a positive number of tokens, got {self.context_window!r}"
            raise ConfigurationError(msg)
        self._backend = backend
        self._options = DecodingOptions(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=tuple(self.stop),
        )

    @classmethod
    def class_name(cls) -> str:
        return "LogTokULLM"

    # -- backend and metadata -------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The core backend (the default ``TransformersBackend`` is built here on first use)."""
        if self._backend is None:
            with self._backend_lock:
                if self._backend is None:
                    from logtoku_guard.backends.transformers import TransformersBackend

                    self._backend = TransformersBackend(self.model, k=self.k, device=self.device, cache_dir=self.cache_dir)
        return self._backend

    @property
    def metadata(self) -> LLMMetadata:
        backend = self.backend
        window = self.context_window or getattr(backend, "context_window", None) or DEFAULT_CONTEXT_WINDOW
        return LLMMetadata(
            context_window=window,
            num_output=self.max_new_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=backend.model_name,
        )

    def _alternatives(self, kwargs: dict[str, Any]) -> tuple[int, Any]:
        """``(n, decode)`` for ``logprobs``: ``top_logprobs=n`` per call fills n entries per token."""
        n = kwargs.get("top_logprobs") or 0
        tokenizer = getattr(self.backend, "tokenizer", None)  # optional: ids are shown as "<id N>" without one
        return int(n), (None if tokenizer is None else lambda i: str(tokenizer.decode([i], skip_special_tokens=False)))

    def decoding_options(self, **kwargs: Any) -> DecodingOptions:
        """The decoding options of one call: the defaults with ``kwargs`` applied (validated)."""
        changes = {name: kwargs[name] for name in _OPTION_KWARGS if name in kwargs}
        if "max_tokens" in kwargs and "max_new_tokens" not in changes:
            changes["max_new_tokens"] = kwargs["max_tokens"]
        ignored = sorted(set(kwargs) - set(_OPTION_KWARGS) - {"max_tokens", "formatted", "top_logprobs", "logprobs"})
        if ignored:
            logger.debug("LogTokULLM ignores keyword arguments %s", ignored)
        return self._options.replace(**changes) if changes else self._options

    # -- core calls -----------------------------------------------------------------------
    def _completion_messages(self, prompt: str, formatted: bool) -> list[CoreMessage]:
        if formatted:
            return [CoreMessage("user", prompt)]
        text = self.completion_to_prompt(prompt) if self.completion_to_prompt is not None else prompt
        head = [CoreMessage("system", self.system_prompt)] if self.system_prompt else []
        return [*head, CoreMessage("user", text)]

    def _generate(
        self, messages: list[CoreMessage], options: DecodingOptions, sinks: tuple[GenerationCapture, ...]
    ) -> Generation:
        """The whole answer; token by token (each reported to the captures, which may stop it) while a
        capture's watch watches an ``early_stop`` rule."""
        if any(s.watch is not None and s.watch.watching for s in sinks):  # the streaming path, drained
            return [g for _, g in self._stream_tokens(messages, options, sinks) if g is not None][-1]
        for sink in sinks:
            sink.started()
        generation = self.backend.generate(messages, options)
        for sink in sinks:
            sink.finished(generation)
        return generation

    def _stream_tokens(
        self, messages: list[CoreMessage], options: DecodingOptions, sinks: tuple[GenerationCapture, ...]
    ) -> Iterator[tuple[TokenScore | None, Generation | None]]:
        """``(token, None)`` per token, one token late; the last item is ``(last token or None, generation)``."""
        stream = self.backend.stream(messages, options)
        generation: Generation | None = None

        def finalize() -> Generation:  # a guard whose reader closed the stream asks for the answer so far
            stream.close()
            return stream.generation

        try:
            for sink in sinks:
                sink.started(stream.close, finalize)
            held: TokenScore | None = None
            with stream:
                for token in stream:
                    for sink in sinks:
                        sink.token(token)
                    if held is not None:
                        yield held, None
                    held = token
            generation = stream.generation
            yield held, generation
        finally:
            if generation is None:  # closed early by the consumer (or failed): report what was generated
                try:
                    stream.close()
                    generation = stream.generation
                except Exception:  # the original error, if any, is the one that propagates
                    logger.debug("no generation to report after the stream ended early", exc_info=True)
            if generation is not None:
                for sink in sinks:
                    sink.finished(generation)

    @staticmethod
    def _payload(generation: Generation) -> dict[str, Any]:
        out = _LogTokUKwargs(tokens=[token_payload(t) for t in generation.tokens], summary=summary_payload(generation))
        return {"logtoku": out}

    @staticmethod
    def _chunk_payload(token: TokenScore | None, generation: Generation | None) -> dict[str, Any]:
        out = _LogTokUKwargs(tokens=[token_payload(token)] if token is not None else [])
        if generation is not None:
            out["summary"] = summary_payload(generation)
        return {"logtoku": out}

    # -- prompt-level streaming (what synthesisers call) ------------------------------------
    def stream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenGen:
        """Stream predict; while a guard withholds the answer, the whole answer as one piece."""
        if withheld():
            return _once(self.predict(prompt, **prompt_args))
        return super().stream(prompt, **prompt_args)

    async def astream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenAsyncGen:
        """Async stream predict; while a guard withholds the answer, the whole answer as one piece."""
        if withheld():
            return _one(await self.apredict(prompt, **prompt_args))
        return await super().astream(prompt, **prompt_args)

    # -- chat -----------------------------------------------------------------------------
    def _chat_response(self, generation: Generation, kwargs: dict[str, Any]) -> ChatResponse:
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=generation.text),
            raw=generation,
            logprobs=_logprobs(generation.tokens, *self._alternatives(kwargs)),
            additional_kwargs=self._payload(generation),
        )

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        generation = self._generate(to_core_messages(messages), self.decoding_options(**kwargs), active_captures())
        return self._chat_response(generation, kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        # Validate and read the active captures now, at call time, not when the stream is read.
        core, options, sinks = to_core_messages(messages), self.decoding_options(**kwargs), active_captures()
        return self._chat_chunks(core, options, sinks)

    def _chat_chunks(
        self, messages: list[CoreMessage], options: DecodingOptions, sinks: tuple[GenerationCapture, ...]
    ) -> Generator[ChatResponse, None, None]:
        text = ""
        for token, generation in self._stream_tokens(messages, options, sinks):
            delta = token.text if token is not None else ""
            text = generation.text if generation is not None else text + delta
            yield ChatResponse(
                message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
                delta=delta,
                raw=generation,
                logprobs=_logprobs([token]) if token is not None else [],
                additional_kwargs=self._chunk_payload(token, generation),
            )

    # -- completion: the chat path on the completion's turns, converted ------------------
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        messages = self._completion_messages(prompt, formatted)
        generation = self._generate(messages, self.decoding_options(**kwargs), active_captures())
        return _as_completion(self._chat_response(generation, kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        messages, options, sinks = (
            self._completion_messages(prompt, formatted),
            self.decoding_options(**kwargs),
            active_captures(),
        )
        return self._completion_chunks(messages, options, sinks)

    def _completion_chunks(
        self, messages: list[CoreMessage], options: DecodingOptions, sinks: tuple[GenerationCapture, ...]
    ) -> Generator[CompletionResponse, None, None]:
        with closing(self._chat_chunks(messages, options, sinks)) as chunks:  # closing this closes the model's stream
            for chunk in chunks:
                yield _as_completion(chunk)

    # -- async: generation is CPU/GPU bound, so it runs in a worker thread ----------------
    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        core, options, sinks = to_core_messages(messages), self.decoding_options(**kwargs), active_captures()
        generation = await asyncio.to_thread(self._generate, core, options, sinks)
        return self._chat_response(generation, kwargs)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        messages, options, sinks = (
            self._completion_messages(prompt, formatted),
            self.decoding_options(**kwargs),
            active_captures(),
        )
        generation = await asyncio.to_thread(self._generate, messages, options, sinks)
        return _as_completion(self._chat_response(generation, kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        core, options, sinks = to_core_messages(messages), self.decoding_options(**kwargs), active_captures()
        return _in_thread(self._chat_chunks(core, options, sinks))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        messages, options, sinks = (
            self._completion_messages(prompt, formatted),
            self.decoding_options(**kwargs),
            active_captures(),
        )
        return _in_thread(self._completion_chunks(messages, options, sinks))


def _as_completion(chat: ChatResponse) -> CompletionResponse:
    """LlamaIndex's own chat -> completion conversion (text, merged ``additional_kwargs``, ``raw``),
    keeping the ``logprobs`` and ``delta`` it leaves out."""
    completion = chat_response_to_completion_response(chat)
    completion.logprobs, completion.delta = chat.logprobs, chat.delta
    return completion


def _once(text: str) -> Generator[str, None, None]:
    yield text


async def _one(text: str) -> AsyncGenerator[str, None]:
    yield text


async def _in_thread(gen: Generator[Any, None, None]) -> AsyncGenerator[Any, None]:
    """Iterate a blocking generator from async code, one ``next()`` per worker-thread call."""
    try:
        while True:
            item = await asyncio.to_thread(next, gen, _END)
            if item is _END:
                return
            yield item
    finally:
        await asyncio.to_thread(gen.close)
