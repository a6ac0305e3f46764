"""``ChatLogTokU``: a LangChain chat model over a core backend, every token scored with LogTokU.

The model, the decoding and the maths are the core's (:mod:`logtoku_guard`); this class only
maps LangChain messages and call arguments onto a core backend and writes the scores into
the message metadata:

- ``response_metadata["logtoku"]``: ``{"tokens": [TokenPayload, ...], **SummaryPayload}``, the core
  payloads (:mod:`logtoku_guard.wire.payloads`): per token ``index, token, id, au, eu, quadrant,
  logprob, entropy, top_logits``; the summary ``model, reliability*, quadrant_shares, n_tokens,
  finish_reason, k, evidence, top_n, prompt_tokens, stop_sequence, thresholds, timings``.
- ``response_metadata["logprobs"]`` (when ``logprobs=True`` or ``top_logprobs=n``): the
  OpenAI format ``{"content": [{token, logprob, bytes, top_logprobs}]}``.
- ``usage_metadata``, ``response_metadata["model_name"]`` and ``["finish_reason"]``.

``top_logprobs`` alternatives come from the backend's ``max_logprobs`` raw top logits per token (default
20), apart from the K that LogTokU scores: asking for 15 changes neither K, AU/EU nor the profile.
Tools (``bind_tools``) use the JSON tool-call prompt and format of :mod:`langchain_logtoku.tools`,
decoded under a grammar (:mod:`langchain_logtoku._structured`); the calls become
``AIMessage.tool_calls``, their per-argument scores ``["logtoku"]["tool_calls"]``.

Streaming and merging. LangChain adds streamed chunks with ``merge_dicts``: strings are
concatenated, ints summed, lists concatenated, and two different floats under one key
raise. So each streamed chunk carries only its own token, as one-item lists
(``{"logtoku": {"tokens": [item]}, "logprobs": {"content": [item]}}``), and a final empty
chunk (``chunk_position="last"``) carries every scalar: the summary, ``model_name``,
``finish_reason`` and ``usage_metadata``. The aggregated stream therefore ends with exactly
the metadata of :meth:`invoke` (but for the wall-clock ``timings`` of the generation). Consumers that keep
only the last chunk's metadata (``stream_events(version="v3")``) see the summary but not the per-token lists.

``invoke`` and ``stream`` generate along one path, the core backend's token stream, and report
the core :class:`~logtoku_guard.types.Generation` (and each token, a cancel hook and a finalizer)
to the active :mod:`logtoku_guard.guard.generation_capture` captures: that is how a caller that does
not make the call itself (``LogTokUMiddleware``, inside an agent) gets raw scores past LangChain's
messages, and can stop a generation early. :class:`~langchain_logtoku.LogTokUGuard` needs no
capture: it generates from core messages through :meth:`ChatLogTokU.open_run` (its drafts are
traced as chat-model runs of this model) and gets each generation as a value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import CallbackManager, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, SkipValidation, model_validator

from langchain_logtoku import _convert, _structured
from langchain_logtoku import tools as _tools
from langchain_logtoku._calls import CallSettings, call_settings
from logtoku_guard.backends.base import Backend
from logtoku_guard.backends.embedded import EMBEDDED_ALIASES, EMBEDDED_MODEL
from logtoku_guard.calibration import ModelProfile, load_profile_for
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.guard.generation_capture import active_captures
from logtoku_guard.scoring.quadrants import QuadrantThresholds
from logtoku_guard.scoring.uncertainty import DEFAULT_K, rescore, validate_k
from logtoku_guard.tools.constraints import DEFAULT_MAX_STRING_LENGTH
from logtoku_guard.types import ChatMessage as CoreMessage
from logtoku_guard.types import DecodingOptions, Generation, TokenScore
from logtoku_guard.wire.payloads import summary_payload, token_payload

_BUILD_FIELDS = ("model", "device", "dtype", "cache_dir", "max_logprobs")
MAX_TOP_LOGPROBS = 20  # the default max_logprobs: raw top logits kept per token for top_logprobs (vLLM's default)


class ChatLogTokU(BaseChatModel):
    """A local chat model whose every token carries LogTokU aleatoric (AU) and epistemic (EU) uncertainty.

    Args:
        backend: a core backend (:class:`~logtoku_guard.backends.transformers.TransformersBackend`,
            :class:`~logtoku_guard.backends.fake.ScriptedBackend`, ...). Default: one built on
            first use from ``model``/``top_k``/``evidence``/``device``/``dtype``/``cache_dir``.
        model: ``None`` for the embedded SmolLM2-135M-Instruct, a local folder, a ``.gguf`` file,
            or a Hugging Face id already in the local cache (nothing is downloaded).
        top_k: K, the number of top raw logits LogTokU reads per token (not sampling top-k;
            decoding is greedy unless ``temperature > 0``). Builds the backend with this K; with
            a given backend it may be smaller than the backend's K (the stored logits are
            re-scored). A per-call ``top_k`` works the same way. Default: the backend's K (2).
        evidence: ``"clamped"`` (default) or ``"raw"`` (builds the backend).
        device, dtype, cache_dir: where and how a built backend loads the model.
        temperature: 0 = greedy (default); ``top_p``: nucleus sampling when ``temperature > 0``.
        max_tokens: new tokens at most (default 256). seed: sampling seed.
        stop: stop strings (cut from the answer, ``finish_reason="stop"``).
        logprobs, top_logprobs: add OpenAI-format ``response_metadata["logprobs"]``;
            ``top_logprobs`` alternatives per token, at most ``max_logprobs``.
        max_logprobs: raw top logits a built backend keeps per token for ``top_logprobs``
            (default 20); separate from K (``top_k``), which alone drives AU/EU.
        logtoku_profile: the model's calibration profile, for token quadrants; ``"auto"``
            (default) loads the saved profile of this model when there is one, ``None`` never.
        max_string_length: under a grammar (tool calls, structured output), the most characters of a string the
            schema leaves unbounded (default 128: the answer ends well-formed; None: unbounded).
        streaming: stream by default inside chains (LangChain's standard flag).
        timeout, max_retries, api_key: accepted for compatibility with LangChain's standard
            chat-model parameters; a local model makes no network calls, so they have no effect.
            Any other unknown keyword is an error.

    Every per-call keyword (``invoke(..., temperature=0.7, max_tokens=32, seed=1, top_k=2,
    top_p=0.9, logprobs=True, top_logprobs=2)``) overrides its field for that call; any other
    keyword is an error. Tools: ``bind_tools(tools, tool_choice=...)``: ``"any"`` or a name forces
    one call (grammar-constrained), ``"auto"`` constrains a call once opened, ``"none"``; with tools
    bound, ``stream()`` yields the whole answer as one chunk, tool calls parsed.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    backend: SkipValidation[Backend | None] = Field(default=None, exclude=True, repr=False)
    model: str | None = None
    top_k: int | None = None
    evidence: Literal["clamped", "raw"] = "clamped"
    device: str = "auto"
    dtype: str = "auto"
    cache_dir: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    max_logprobs: int = MAX_TOP_LOGPROBS
    disable_streaming: bool | Literal["tool_calling"] = "tool_calling"
    logtoku_profile: ModelProfile | Literal["auto"] | None = Field(default="auto", exclude=True, repr=False)
    max_string_length: int | None = Field(default=DEFAULT_MAX_STRING_LENGTH, ge=1)
    streaming: bool = False
    timeout: float | None = None
    max_retries: int | None = None
    api_key: SecretStr | None = Field(default=None, exclude=True, repr=False)

    _built: Any = PrivateAttr(default=None)
    _build_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _thresholds: dict[int, QuadrantThresholds | None] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _validate(self) -> ChatLogTokU:
        if self.backend is not None:
            if not isinstance(self.backend, Backend):
                msg = (
                    f"backend must be a logtoku_guard backend (model_name, k, generate, stream, batch), "
                    f"got {type(self.backend).__name__}; e.g. TransformersBackend() or ScriptedBackend(...)"
                )
                raise ConfigurationError(msg)
            given = [
                name for name in _BUILD_FIELDS if name in self.model_fields_set and getattr(self, name) not in (None, "auto")
            ]
            if given:
                msg = f"pass either backend=... or {given} to build one, not both"
                raise ConfigurationError(msg)
            backend_evidence = self.backend.evidence
            if "evidence" in self.model_fields_set and self.evidence != backend_evidence:
                msg = f"evidence={self.evidence!r} but the backend scores with {backend_evidence!r}; drop evidence="
                raise ConfigurationError(msg)
        if self.top_k is not None:
            validate_k(self.top_k)
            if self.backend is not None and self.top_k > self.backend.k:
                msg = f"top_k={self.top_k} exceeds the backend's K={self.backend.k}; build the backend with k >= {self.top_k}"
                raise ConfigurationError(msg)
        DecodingOptions(
            max_new_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=tuple(self.stop or ()),
        )
        if self.top_logprobs is not None:
            _convert.check_top_logprobs(self.top_logprobs, self._configured_k(), self._capacity(self.backend))
        return self

    # -- identity ------------------------------------------------------------------------
    @property
    def _llm_type(self) -> str:
        return "logtoku-chat"

    @property
    def model_name(self) -> str:
        """The model's name (without loading it)."""
        if self.backend is not None:
            return str(self.backend.model_name)
        if self._built is not None:
            return str(self._built.model_name)
        if self.model is None or self.model in EMBEDDED_ALIASES:
            return EMBEDDED_MODEL
        return str(self.model)

    @property
    def scoring_evidence(self) -> str:
        """The evidence mode of the scores (``clamped`` or ``raw``)."""
        if self.backend is not None:
            return str(self.backend.evidence)
        return self.evidence

    def _configured_k(self) -> int:
        """The backend's K, without loading it."""
        if self.backend is not None:
            return int(self.backend.k)
        return self.top_k if self.top_k is not None else DEFAULT_K

    @property
    def scoring_k(self) -> int:
        """K used for AU/EU by default (the ``top_k`` field, else the backend's K)."""
        return self.top_k if self.top_k is not None else self._configured_k()

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "top_k": self.scoring_k,
            "evidence": self.scoring_evidence,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        model = kwargs.get("model")
        params = LangSmithParams(
            ls_provider=self._provider(),
            ls_model_name=model if isinstance(model, str) else self.model_name,
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params

    def _provider(self) -> str:
        backend = self.backend if self.backend is not None else self._built
        if backend is None or type(backend).__name__ == "TransformersBackend":
            return "huggingface"
        return "logtoku"

    # -- the backend ---------------------------------------------------------------------
    @property
    def core_backend(self) -> Backend:
        """The core backend (built and loaded on first use when none was given)."""
        if self.backend is not None:
            return self.backend
        with self._build_lock:
            if self._built is None:
                from logtoku_guard.backends.transformers import TransformersBackend

                self._built = TransformersBackend(
                    self.model,
                    k=self._configured_k(),
                    evidence=self.evidence,
                    device=self.device,
                    dtype=self.dtype,
                    cache_dir=self.cache_dir,
                )
            return self._built

    def quadrant_thresholds(self, k: int | None = None) -> QuadrantThresholds | None:
        """AU/EU quadrant thresholds (the medians of the calibration profile), or None without one."""
        k = self.scoring_k if k is None else k
        if k not in self._thresholds:
            profile = self.logtoku_profile
            if profile == "auto":
                profile = load_profile_for(self.model_name, k, self.scoring_evidence, self.cache_dir)
            ok = isinstance(profile, ModelProfile) and (profile.model, profile.k, profile.evidence) == (
                self.model_name,
                k,
                self.scoring_evidence,
            )
            self._thresholds[k] = profile.quadrant_thresholds() if ok else None  # type: ignore[union-attr]
        return self._thresholds[k]

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids from the model's own tokenizer (when the backend has one)."""
        tokenizer = getattr(self.core_backend, "tokenizer", None)
        if tokenizer is None or self.custom_get_token_ids is not None:
            return super().get_token_ids(text)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- per-call settings ---------------------------------------------------------------
    def _capacity(self, backend: Backend | None) -> int:
        """Raw top logits kept per token: the backend's ``max_logprobs`` (else its K), or the field."""
        return (
            max(self.max_logprobs, self._configured_k()) if backend is None else int(getattr(backend, "max_logprobs", backend.k))
        )

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (OpenAI format), described to the model by the JSON tool-call prompt."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        _tools.tool_choice_name(tool_choice, _tools.names(formatted))  # fail early
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(
        self, schema: dict[str, Any] | type, *, method: str = "function_calling", include_raw: bool = False, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        """Answers parsed into ``schema``, decoded under a grammar: ``function_calling`` (a forced
        tool call, the default), ``json_schema`` or ``json_mode`` (the answer is the JSON itself)."""
        kwargs.pop("strict", None)
        calling = super().with_structured_output if method == "function_calling" else None
        return _structured.with_structured_output(self, schema, method, include_raw, calling, kwargs)

    def _call(self, stop: list[str] | None, kwargs: dict[str, Any]) -> CallSettings:
        return call_settings(self, stop, kwargs)

    @staticmethod
    def core_prompt(messages: list[CoreMessage], call: CallSettings) -> list[CoreMessage]:
        """The core prompt of a call: ``messages`` with the call's schema and tool-call instructions."""
        prompt = _tools.with_tool_prompt(messages, call.schema_prompt)
        return _tools.with_tool_prompt(prompt, _tools.tool_prompt(call.tools, call.tool_choice))

    def open_run(
        self, messages: list[CoreMessage], config: RunnableConfig, kwargs: dict[str, Any]
    ) -> tuple[CallbackManagerForLLMRun, CallSettings]:
        """A chat-model run of this model for core ``messages`` under ``config`` (its callbacks, tags and
        metadata), started as ``invoke`` starts one; returns its run manager and the call's settings.
        The caller generates with :attr:`core_backend` and ends the run (``on_llm_end``/``on_llm_error``)."""
        call = self._call(None, kwargs)
        manager = CallbackManager.configure(
            config.get("callbacks"),
            self.callbacks,
            self.verbose,
            config.get("tags"),
            self.tags,
            {**config.get("metadata", {}), **self._get_ls_params(stop=None, **kwargs)},
            self.metadata,
        )
        (run,) = manager.on_chat_model_start(
            self._serialized,
            [_convert.to_langchain_messages(messages)],  # what the trace shows; generation reads the core messages
            invocation_params=self._get_invocation_params(stop=None, **kwargs),
            options={"stop": None},
            name=config.get("run_name"),
            batch_size=1,
        )
        return run, call

    def rescored(self, token: TokenScore, call: CallSettings) -> TokenScore:
        if call.k == call.backend_k:
            return token
        r = rescore([token.top_logits], k=call.k, evidence=self.scoring_evidence)  # type: ignore[arg-type]
        return dataclasses.replace(token, au=float(r.au[0]), eu=float(r.eu[0]))

    def finished(self, generation: Generation, call: CallSettings) -> Generation:
        if call.k == call.backend_k:
            return generation
        return dataclasses.replace(generation, tokens=tuple(self.rescored(t, call) for t in generation.tokens), k=call.k)

    # -- metadata ------------------------------------------------------------------------
    def token_metadata(self, token: TokenScore, call: CallSettings, decode: Callable[[int], str]) -> dict[str, Any]:
        meta: dict[str, Any] = {"logtoku": {"tokens": [token_payload(token, self.quadrant_thresholds(call.k))]}}
        if call.logprobs:
            meta["logprobs"] = {"content": [_convert.logprob_item(token, call.top_logprobs, decode)]}
        return meta

    def _final_metadata(self, generation: Generation, call: CallSettings, *, with_tokens: bool) -> dict[str, Any]:
        thresholds = self.quadrant_thresholds(call.k)
        logtoku: dict[str, Any] = dict(summary_payload(generation, thresholds))
        meta: dict[str, Any] = {"model_name": generation.model, "finish_reason": generation.finish_reason}
        if with_tokens:
            logtoku = {"tokens": [token_payload(t, thresholds) for t in generation.tokens], **logtoku}
        meta["logtoku"] = logtoku
        if call.logprobs and with_tokens:
            decode = _convert.decoder(self.core_backend)
            meta["logprobs"] = {"content": [_convert.logprob_item(t, call.top_logprobs, decode) for t in generation.tokens]}
        if generation.stop_sequence is not None:
            meta["stop_sequence"] = generation.stop_sequence
        return meta

    def response_metadata_for(self, generation: Generation, **kwargs: Any) -> dict[str, Any]:
        """The ``response_metadata`` :meth:`invoke` gives for ``generation`` (``kwargs`` as per call)."""
        return self._final_metadata(generation, self._call(None, kwargs), with_tokens=True)

    # -- generation ----------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._call(stop, kwargs)
        tokens = self._tokens(self.core_prompt(_convert.to_core_messages(messages), call), call)
        while True:
            try:
                next(tokens)
            except StopIteration as end:
                generation: Generation = end.value
                break
        return ChatResult(generations=[ChatGeneration(message=self.message_for(generation, call))])

    def _tokens(self, prompt: list[CoreMessage], call: CallSettings) -> Generator[TokenScore, None, Generation]:
        """The one generation path of ``invoke`` and ``stream``: the core backend's token stream, each
        token rescored for the call's K and reported to the active captures (which may stop it);
        returns the finished generation. Closed early or failed, the captures get what was generated."""
        sinks = active_captures()
        stream = self.core_backend.stream(prompt, call.options)

        def finalize() -> Generation:
            stream.close()
            return self.finished(stream.generation, call)

        for sink in sinks:
            sink.started(stream.close, finalize)
        try:
            with stream:
                for core_token in stream:
                    token = self.rescored(core_token, call)
                    for sink in sinks:
                        sink.token(token)
                    yield token
            generation = self.finished(stream.generation, call)
        except BaseException:  # closed early (GeneratorExit) or failed: hand over what was generated
            if sinks:
                with contextlib.suppress(Exception):  # the original error is the one that propagates
                    partial = finalize()
                    for sink in sinks:
                        sink.finished(partial)
            raise
        for sink in sinks:
            sink.finished(generation)
        return generation

    def message_for(self, generation: Generation, call: CallSettings) -> AIMessage:
        """The ``AIMessage`` of a finished generation: its text (or tool calls), metadata and usage."""
        names = _tools.names(call.tools)
        content, calls, invalid = _tools.parse_tool_calls(generation.text, names) if names else (generation.text, [], [])
        meta = self._final_metadata(generation, call, with_tokens=True)
        if names:
            meta["logtoku"]["tool_calls"] = _tools.tool_call_scores(calls, generation.tokens)
        return AIMessage(
            content=content,
            additional_kwargs=_tools.openai_tool_calls(calls),
            tool_calls=calls,
            invalid_tool_calls=invalid,
            response_metadata=meta,
            usage_metadata=_convert.usage(generation),
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._call(stop, kwargs)
        if call.tools:  # tool calls are parsed from the whole answer: one chunk
            message = self._generate(messages, stop, run_manager, **kwargs).generations[0].message
            yield ChatGenerationChunk(message=_tools.as_last_chunk(message))  # type: ignore[arg-type]
            return
        decode = _convert.decoder(self.core_backend)
        tokens = self._tokens(self.core_prompt(_convert.to_core_messages(messages), call), call)
        emitted = 0
        try:
            while True:
                try:
                    token = next(tokens)
                except StopIteration as end:
                    generation: Generation = end.value
                    break
                emitted += 1
                meta = self.token_metadata(token, call, decode)
                yield ChatGenerationChunk(message=AIMessageChunk(content=token.text, response_metadata=meta))
        finally:
            tokens.close()  # a reader that stops early stops the generation
        meta = self._final_metadata(generation, call, with_tokens=False)
        if emitted == 0:  # nothing streamed: the lists must still exist in the aggregate
            meta["logtoku"] = {"tokens": [], **meta["logtoku"]}
            if call.logprobs:
                meta["logprobs"] = {"content": []}
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                response_metadata=meta,
                usage_metadata=_convert.usage(generation),
                chunk_position="last",
            )
        )
