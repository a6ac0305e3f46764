"""``ChatLogTokU``: a LangChain chat model over a core backend, every token scored with LogTokU.

The model, the decoding and the maths are the core's (:mod:`logtoku_guard`); this class only
maps LangChain messages and call arguments onto a core backend and writes the scores into
the message metadata:

- ``response_metadata["logtoku"]``: ``{"tokens": [TokenPayload, ...], **SummaryPayload}``, the core
  payloads (:mod:`logtoku_guard.payloads`): per token ``index, token, id, au, eu, quadrant,
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

Every call also reports its core :class:`~logtoku_guard.types.Generation` (and each token, a
cancel hook and a finalizer) to the active :mod:`logtoku_guard.generation_capture` captures: that is how
:class:`~langchain_logtoku.LogTokUGuard` gets raw scores past LangChain's messages. With a
capture active, ``invoke`` generates through the token stream internally (same result, nothing
streamed to callbacks), so a capture can stop it early.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, SkipValidation, model_validator

from langchain_logtoku import _convert, _structured
from langchain_logtoku import tools as _tools
from logtoku_guard.backends.base import Backend
from logtoku_guard.calibration import ModelProfile, load_profile_for
from logtoku_guard.constraints import DEFAULT_MAX_STRING_LENGTH
from logtoku_guard.embedded import EMBEDDED_ALIASES, EMBEDDED_MODEL
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.generation_capture import active_captures
from logtoku_guard.payloads import summary_payload, token_payload
from logtoku_guard.quadrants import QuadrantThresholds
from logtoku_guard.types import DecodingOptions, Generation, TokenScore
from logtoku_guard.uncertainty import DEFAULT_K, rescore, validate_k

_BUILD_FIELDS = ("model", "device", "dtype", "cache_dir", "max_logprobs")
MAX_TOP_LOGPROBS = 20  # the default max_logprobs: raw top logits kept per token for top_logprobs (vLLM's default)


@dataclass(frozen=True)
class _Call:
    """The settings of one call: fields overridden by per-call arguments, validated."""

    options: DecodingOptions
    k: int
    backend_k: int
    logprobs: bool
    top_logprobs: int
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | None = None
    schema_prompt: str | None = None  # the response_format's JSON schema, told to the model


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

    def _call(self, stop: list[str] | None, kwargs: dict[str, Any]) -> _Call:
        unknown, accepted = set(kwargs) - _convert.CALL_ARGS, sorted(_convert.CALL_ARGS - {"stream"})
        if legacy := unknown & _convert.LEGACY_TOOL_ARGS:
            msg = f"legacy function calling is not supported (got {sorted(legacy)}): use tool calling, bind_tools"
            raise NotImplementedError(msg)
        if unknown:
            msg = f"unknown call argument(s) {sorted(unknown)}; ChatLogTokU accepts {accepted} and stop"
            raise ConfigurationError(msg)
        model = kwargs.get("model")
        if model is not None and model != self.model_name:
            msg = (
                f"this ChatLogTokU serves {self.model_name!r}; model={model!r} per call is not supported: "
                "create another ChatLogTokU(model=...)"
            )
            raise ConfigurationError(msg)
        stops = self.stop if stop is None else stop
        options = DecodingOptions(
            max_new_tokens=kwargs.get("max_tokens", self.max_tokens),
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            seed=kwargs.get("seed", self.seed),
            stop=tuple(stops or ()),
        )
        backend_k = int(self.core_backend.k)
        k = kwargs.get("top_k", self.top_k)
        k = backend_k if k is None else validate_k(k)
        if k > backend_k:
            msg = f"top_k={k} exceeds the backend's K={backend_k}; build the model with top_k >= {k}"
            raise ConfigurationError(msg)
        top_lp = kwargs.get("top_logprobs", self.top_logprobs)
        logprobs = bool(kwargs.get("logprobs", self.logprobs)) or top_lp is not None
        bound = tuple(convert_to_openai_tool(t) for t in kwargs.get("tools") or ())
        choice = _tools.tool_choice_name(kwargs.get("tool_choice"), _tools.names(bound))
        fmt, cap = kwargs.get("response_format"), self.max_string_length
        options, note = _structured.constrained(options, fmt, bound, choice, self.core_backend, cap)
        return _Call(
            options=options,
            k=k,
            backend_k=backend_k,
            logprobs=logprobs,
            top_logprobs=0 if top_lp is None else _convert.check_top_logprobs(top_lp, k, self._capacity(self.core_backend)),
            tools=bound if choice != "none" else (),
            tool_choice=choice,
            schema_prompt=note,
        )

    @staticmethod
    def _prompt(messages: list[BaseMessage], call: _Call) -> list[Any]:
        prompt = _tools.with_tool_prompt(_convert.to_core_messages(messages), call.schema_prompt)
        return _tools.with_tool_prompt(prompt, _tools.tool_prompt(call.tools, call.tool_choice))

    def _rescored(self, token: TokenScore, call: _Call) -> TokenScore:
        if call.k == call.backend_k:
            return token
        r = rescore([token.top_logits], k=call.k, evidence=self.scoring_evidence)  # type: ignore[arg-type]
        return dataclasses.replace(token, au=float(r.au[0]), eu=float(r.eu[0]))

    def _finished(self, generation: Generation, call: _Call) -> Generation:
        if call.k == call.backend_k:
            return generation
        return dataclasses.replace(generation, tokens=tuple(self._rescored(t, call) for t in generation.tokens), k=call.k)

    # -- metadata ------------------------------------------------------------------------
    def _token_metadata(self, token: TokenScore, call: _Call, decode: Callable[[int], str]) -> dict[str, Any]:
        meta: dict[str, Any] = {"logtoku": {"tokens": [token_payload(token, self.quadrant_thresholds(call.k))]}}
        if call.logprobs:
            meta["logprobs"] = {"content": [_convert.logprob_item(token, call.top_logprobs, decode)]}
        return meta

    def _final_metadata(self, generation: Generation, call: _Call, *, with_tokens: bool) -> dict[str, Any]:
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
        if active_captures() and not call.tools:  # token by token, so that a capture can stop it early (cancel_stream)
            return generate_from_stream(self._stream(messages, stop, None, **kwargs))
        prompt = self._prompt(messages, call)
        sinks = active_captures()
        for sink in sinks:
            sink.started()
        generation = self._finished(self.core_backend.generate(prompt, call.options), call)
        for sink in sinks:
            sink.finished(generation)
        names = _tools.names(call.tools)
        content, calls, invalid = _tools.parse_tool_calls(generation.text, names) if names else (generation.text, [], [])
        meta = self._final_metadata(generation, call, with_tokens=True)
        if names:
            meta["logtoku"]["tool_calls"] = _tools.tool_call_scores(calls, generation.tokens)
        message = AIMessage(
            content=content,
            additional_kwargs=_tools.openai_tool_calls(calls),
            tool_calls=calls,
            invalid_tool_calls=invalid,
            response_metadata=meta,
            usage_metadata=_convert.usage(generation),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

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
        prompt = self._prompt(messages, call)
        sinks = active_captures()
        decode = _convert.decoder(self.core_backend)
        stream = self.core_backend.stream(prompt, call.options)

        def finalize() -> Generation:
            stream.close()
            return self._finished(stream.generation, call)

        for sink in sinks:
            sink.started(stream.close, finalize)
        emitted = 0
        try:
            with stream:
                for core_token in stream:
                    token = self._rescored(core_token, call)
                    emitted += 1
                    for sink in sinks:
                        sink.token(token)
                    yield ChatGenerationChunk(
                        message=AIMessageChunk(content=token.text, response_metadata=self._token_metadata(token, call, decode))
                    )
            generation = self._finished(stream.generation, call)
        except BaseException:  # closed early (GeneratorExit) or failed: hand over what was generated
            if sinks:
                with contextlib.suppress(Exception):  # the original error is the one that propagates
                    partial = finalize()
                    for sink in sinks:
                        sink.finished(partial)
            raise
        for sink in sinks:
            sink.finished(generation)
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
