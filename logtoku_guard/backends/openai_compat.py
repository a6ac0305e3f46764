"""A backend over an OpenAI-compatible server that gives raw top-K logits: ``logtoku-guard serve`` or vLLM.

AU/EU need the model's **raw logits**, not log-probabilities. ``logtoku-guard serve`` sends them
in each token's ``logtoku`` extension (``top_logits``, whatever its ``--logprobs-mode``), with
token ids and the true full-softmax log p and entropy, and the question's own tokens scored at
the prefill (``choices[].logtoku.prompt_scores``): from it a remote guard has the same
:class:`~logtoku_guard.scoring.stats.ResponseStats` and ``guard_score`` as a local one. vLLM puts raw
logits in ``top_logprobs`` when started with ``vllm serve MODEL --logprobs-mode raw_logits
--max-logprobs 20``. Each request asks for ``logprobs=true, top_logprobs=K`` on
``/chat/completions``; AU/EU are then computed here with the same maths as a local backend
(:func:`logtoku_guard.scoring.uncertainty.logtoku` on the K largest values), so local and remote scores
agree to float rounding.

What vLLM's wire cannot give, and what this backend does instead:

* ``logprob`` and ``entropy`` of a :class:`TokenScore` are defined on the *full* softmax. The
  wire carries only K raw logits, so from vLLM they are computed on the **top-K renormalised**
  softmax: ``logprob = z_chosen - logsumexp(top-K z)`` (an upper bound of the true log p: the
  missing vocabulary mass is ignored) and ``entropy`` of that K-way softmax. A sampled token
  outside the top-K has ``logprob`` NaN.
* token ids: vLLM sends token strings only, so ``id`` and ``top_ids`` are ``-1``.
* prompt scores: none. The guard's prompt-side statistics are then undefined and a fitted
  guard scores them as its fit data's means; the backend says so once with a
  :class:`MissingPromptScoresWarning`, naming what is missing.

A server that sends only log-probabilities (vLLM's default ``--logprobs-mode raw_logprobs``, or an
OpenAI-compatible server without the ``logtoku`` extension) is refused with
:class:`LogProbsNotLogitsError`: AU/EU of log-probabilities are meaningless.
Requests and responses are the models of :mod:`logtoku_guard.wire.openai_protocol` (the server's
own); ``httpx`` is imported only when the backend is created.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from pydantic import TypeAdapter

from logtoku_guard.backends.base import ScoringIdentity, TokenStream
from logtoku_guard.backends.openai_reading import CHUNK_OR_ERROR, StreamState, as_float, token_entries, topk_stats
from logtoku_guard.errors import ConfigurationError, LogProbsNotLogitsError, MissingDependencyError, RemoteServerError
from logtoku_guard.scoring.uncertainty import (
    DEFAULT_K,
    DEFAULT_TOP_N,
    EvidenceMode,
    row_lse_entropy,
    token_logtoku,
)
from logtoku_guard.tools.constraints import refuse_constraint
from logtoku_guard.types import (
    ChatMessage,
    DecodingOptions,
    FinishReason,
    Generation,
    Prompt,
    Timings,
    TokenScore,
    question_of,
    to_messages,
)
from logtoku_guard.wire import openai_protocol as proto
from logtoku_guard.wire.openai_errors import withheld_message

__all__ = ["MissingPromptScoresWarning", "OpenAICompatibleBackend", "served_models"]


class MissingPromptScoresWarning(UserWarning):
    """The server sends no scores of the question's own tokens: the guard's prompt statistics are undefined."""


_CHECK_TOKENS = 8
"""How many first tokens of an answer the log-probability check looks at."""


class OpenAICompatibleBackend(ScoringIdentity):
    """LogTokU-scored generation on a remote OpenAI-compatible server returning raw top-K logits.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: the model name the server serves.
        api_key: sent as ``Authorization: Bearer KEY`` when given.
        k: top-K raw logits per token (the server must allow ``top_logprobs >= k``).
        evidence, top_n: as for :class:`~logtoku_guard.backends.transformers.TransformersBackend`.
        timeout: seconds to wait for the server (connect and each read).
        max_concurrency: requests :meth:`batch` keeps in flight (the server batches them).
        client: an ``httpx.Client`` to use (custom TLS, proxies, a mock transport in tests).
    """

    honours_logit_params = True
    """``logit_bias`` and the penalties are sent to the remote server (which applies them, or refuses them with a 400)."""

    provider: ClassVar[str | None] = "openai"
    """The ``gen_ai.provider.name`` of this backend's spans."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        k: int = DEFAULT_K,
        evidence: EvidenceMode = "clamped",
        top_n: int = DEFAULT_TOP_N,
        timeout: float = 120.0,
        max_concurrency: int = 8,
        client: Any = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            msg = f"base_url must be an http(s) URL such as 'http://127.0.0.1:8000/v1', got {base_url!r}"
            raise ConfigurationError(msg)
        if not isinstance(model, str) or not model:
            msg = f"model must be the name the server serves (see GET {base_url}/models), got {model!r}"
            raise ConfigurationError(msg)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            msg = f"timeout must be a positive number of seconds, got {timeout!r}"
            raise ConfigurationError(msg)
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            msg = f"max_concurrency must be a positive integer, got {max_concurrency!r}"
            raise ConfigurationError(msg)
        self._identify(model, k, evidence, top_n)
        self.base_url = base_url.rstrip("/")
        self._model = model
        self._max_concurrency = max_concurrency
        self._warned_prompt = False
        try:
            import httpx
        except ImportError as exc:
            msg = "OpenAICompatibleBackend needs httpx: pip install 'logtoku-guard[serve]' (or pip install httpx)"
            raise MissingDependencyError(msg) from exc
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client if client is not None else httpx.Client(timeout=timeout)
        self._headers = headers

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def __enter__(self) -> OpenAICompatibleBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API -------------------------------------------------------------------
    def generate(self, prompt: Prompt, options: DecodingOptions | None = None, *, system: str | None = None) -> Generation:
        """One answer with every token scored (a ``/chat/completions`` request)."""
        import httpx

        messages = to_messages(prompt, system)
        body = self._body(messages, options or DecodingOptions(), stream=False)
        start = time.perf_counter()
        try:
            response = self._client.post(self._url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        self._raise_for_status(response.status_code, response.text)
        data = self._parse(proto.ChatCompletionResponse, response.text, "a chat completion")
        total = time.perf_counter() - start
        choice = data.choices[0]
        self._refuse_withheld(choice.message.refusal, choice.logtoku_guard)
        entries = token_entries(choice.logprobs)
        text = choice.message.content or ""
        finish, stop = choice.finish_reason, choice.stop_reason
        prompt_tokens = data.usage.prompt_tokens if data.usage else 0
        tokens = self._tokens(entries)
        if text and not tokens:
            msg = f"{self._url} sent no logprobs; the server must support logprobs=true, top_logprobs={self._k}"
            raise RemoteServerError(msg)
        n = len(tokens)
        scored_prompt = self._prompt_scores(choice.logtoku)
        return self._generation(
            messages, text, tokens, finish, stop, prompt_tokens, Timings(total, None, n / total if n else None), scored_prompt
        )

    def stream(self, prompt: Prompt, options: DecodingOptions | None = None, *, system: str | None = None) -> TokenStream:
        """Each token with its AU/EU as the server streams it (server-sent events)."""
        messages = to_messages(prompt, system)
        body = self._body(messages, options or DecodingOptions(), stream=True)
        state = StreamState()
        tokens = self._stream_tokens(body, state)

        def result() -> Generation:
            total = time.perf_counter() - state.start
            finish = state.finish if not state.cancelled else "abort"
            n = len(state.tokens)
            timings = Timings(total, state.first_s, n / total if n and total > 0 else None)
            prompt = self._prompt_scores(state.summary)
            return self._generation(messages, state.text, state.tokens, finish, state.stop, state.prompt_tokens, timings, prompt)

        def cancel() -> None:
            state.cancelled = True
            tokens.close()

        return TokenStream(tokens, result, cancel)

    def batch(
        self, prompts: Sequence[Prompt], options: DecodingOptions | None = None, *, system: str | None = None
    ) -> list[Generation]:
        """Several answers, sent concurrently (up to ``max_concurrency``) so the server can batch them."""
        if isinstance(prompts, str) or not prompts:
            msg = f"batch() takes a non-empty list of prompts, got {prompts!r}; use generate() for one prompt"
            raise ConfigurationError(msg)
        with ThreadPoolExecutor(min(self._max_concurrency, len(prompts)), thread_name_prefix="logtoku-remote") as pool:
            return list(pool.map(lambda p: self.generate(p, options, system=system), prompts))

    # -- internals --------------------------------------------------------------------
    @property
    def _url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _body(self, messages: list[ChatMessage], options: DecodingOptions, *, stream: bool) -> dict[str, Any]:
        refuse_constraint(options.constraint, "OpenAI-compatible", "it does not forward grammars to the remote server")
        if options.dynamic is not None:
            msg = "dynamic temperature needs each step's logits before sampling; it runs only on a local backend"
            raise ConfigurationError(msg)
        fields: dict[str, Any] = {
            "model": self._model,
            "messages": [proto.ChatMessageParam(role=m.role, content=m.content) for m in messages],
            "max_tokens": options.max_new_tokens,
            "temperature": float(options.temperature),
            "top_p": float(options.top_p),
            "logprobs": True,
            "top_logprobs": self._k,
            "stream": stream,
        }
        if stream:
            fields["stream_options"] = proto.StreamOptions(include_usage=True)
        if options.seed is not None:
            fields["seed"] = options.seed
        if options.stop:
            fields["stop"] = list(options.stop)
        if options.logit_bias:
            fields["logit_bias"] = {str(token): bias for token, bias in options.logit_bias}
        if options.frequency_penalty:
            fields["frequency_penalty"] = float(options.frequency_penalty)
        if options.presence_penalty:
            fields["presence_penalty"] = float(options.presence_penalty)
        try:
            request = proto.ChatCompletionRequest(**fields)
        except proto.ValidationError as exc:
            raise ConfigurationError(proto.describe_errors(exc.errors())[0]) from exc
        return request.model_dump(mode="json", exclude_unset=True)

    def _parse(self, model: Any, text: str, what: str) -> Any:
        """``text`` read as ``model`` (a response model or type adapter); RemoteServerError when it is not one."""
        try:
            if isinstance(model, TypeAdapter):
                return model.validate_json(text)
            return model.model_validate_json(text)
        except proto.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the body"
            msg = f"{self._url} sent a response that is not {what} ({where}: {first['msg']}): {text[:200]!r}"
            raise RemoteServerError(msg) from exc

    def _unreachable(self, exc: Exception) -> RemoteServerError:
        msg = f"cannot reach {self._url} ({exc.__class__.__name__}: {exc}); is the server running and base_url right?"
        return RemoteServerError(msg)

    def _refuse_withheld(self, refusal: str | None, decision: Any) -> None:
        """Raise :class:`RemoteServerError` when the server sent a refusal, not an answer (nothing to score)."""
        msg = withheld_message(self._url, refusal, decision)
        if msg is not None:
            raise RemoteServerError(msg)

    def _raise_for_status(self, status: int, text: str) -> None:
        if status < 400:
            return
        try:
            detail = proto.ErrorResponse.model_validate_json(text).error.message
        except proto.ValidationError:
            detail = text[:300]
        hint = " (check api_key)" if status == 401 else ""
        if "logprobs" in str(detail) and status == 400:
            hint = f" (the server must allow top_logprobs={self._k}: for vLLM start it with --max-logprobs {max(20, self._k)})"
        msg = f"{self._url} answered HTTP {status}: {detail}{hint}"
        raise RemoteServerError(msg)

    def _tokens(self, entries: Sequence[proto.ChatTokenLogprob], start_index: int = 0, check: bool = True) -> list[TokenScore]:
        """TokenScores from ``logprobs.content`` entries (AU/EU recomputed from the raw top-K)."""
        if not entries:
            return []
        rows = [self._top_values(e) for e in entries]
        if check:
            self._refuse_logprobs([z for e, z in zip(entries, rows) if e.logtoku is None][:_CHECK_TOKENS])
        au, eu = token_logtoku(rows, self._evidence)
        out = []
        for j, (e, z) in enumerate(zip(entries, rows)):
            extra = e.logtoku  # only from logtoku-guard serve: ids and the true full-softmax values
            if extra is not None:
                text, token_id, top_ids = extra["token"], extra["id"], tuple(extra["top_ids"][: self._k])
                logprob, entropy = as_float(extra["logprob"]), as_float(extra["entropy"])
            else:
                text, token_id, top_ids = e.token, -1, (-1,) * self._k
                logprob, entropy = topk_stats(as_float(e.logprob), z)
            out.append(
                TokenScore(
                    index=int(extra["index"]) if extra is not None else start_index + j,
                    id=token_id,
                    text=text,
                    top_logits=tuple(z),
                    top_ids=top_ids,
                    au=float(au[j]),
                    eu=float(eu[j]),
                    logprob=logprob,
                    entropy=entropy,
                )
            )
        return out

    def _top_values(self, entry: proto.ChatTokenLogprob) -> list[float]:
        """The K largest raw logits of one token, largest first: from this server's ``logtoku`` extension
        (whatever its ``logprob`` holds), else from ``top_logprobs`` (vLLM's ``raw_logits`` mode)."""
        if entry.logtoku is not None:
            raw = [float(z) for z in entry.logtoku["top_logits"] if z is not None]
            if len(raw) < self._k:
                msg = (
                    f"{self._url} keeps K={len(raw)} raw logits per token but this backend needs K={self._k}; "
                    f"restart the server with --top-k {self._k}, or use k={len(raw)}"
                )
                raise RemoteServerError(msg)
            return raw[: self._k]
        tops = sorted((t.logprob for t in entry.top_logprobs if t.logprob is not None), reverse=True)
        if len(tops) < self._k:
            msg = (
                f"{self._url} sent {len(tops)} top_logprobs per token but K={self._k} are needed; "
                f"for vLLM start it with --max-logprobs {max(20, self._k)}, or use a smaller k"
            )
            raise RemoteServerError(msg)
        return tops[: self._k]

    def _refuse_logprobs(self, rows: Sequence[Sequence[float]]) -> None:
        """Raise when every checked token's values look like log-probabilities (<= 0, mass <= 1)."""
        if not rows:
            return

        def looks_like_logprobs(z: Sequence[float]) -> bool:
            return max(z) <= 0.0 and row_lse_entropy([z])[0][0] <= 1e-3  # mass <= 1, with rounding

        if all(looks_like_logprobs(r) for r in rows):
            msg = (
                f"the server at {self.base_url} returns log-probabilities, not raw logits, in top_logprobs "
                f"(top values of the first {len(rows)} token(s) are all <= 0 and sum to a probability <= 1); "
                "AU/EU would be meaningless. Start vLLM with --logprobs-mode raw_logits "
                "(vllm serve MODEL --logprobs-mode raw_logits --max-logprobs 20), or use logtoku-guard serve"
            )
            raise LogProbsNotLogitsError(msg)

    def _stream_tokens(self, body: dict[str, Any], state: StreamState) -> Generator[TokenScore, None, None]:
        import httpx

        state.start = time.perf_counter()
        try:
            with self._client.stream("POST", self._url, json=body, headers=self._headers) as response:
                if response.status_code >= 400:
                    response.read()
                    self._raise_for_status(response.status_code, response.text)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = self._parse(CHUNK_OR_ERROR, payload, "a chat completion chunk")
                    if isinstance(chunk, proto.ErrorResponse):
                        msg = f"{self._url} failed while streaming: {chunk.error.message}"
                        raise RemoteServerError(msg)
                    if chunk.usage:
                        state.prompt_tokens = chunk.usage.prompt_tokens
                    for choice in chunk.choices:
                        state.text += choice.delta.content or ""
                        if choice.delta.refusal is not None:
                            state.refusal = (state.refusal or "") + choice.delta.refusal
                        if choice.finish_reason:
                            state.finish = choice.finish_reason
                            state.stop = choice.stop_reason
                            state.summary = choice.logtoku
                            self._refuse_withheld(state.refusal, choice.logtoku_guard)
                        entries = token_entries(choice.logprobs)
                        new = self._tokens(entries, start_index=len(state.tokens), check=False)
                        if new and state.first_s is None:
                            state.first_s = time.perf_counter() - state.start
                        state.tokens.extend(new)
                        if len(state.tokens) < _CHECK_TOKENS:
                            continue  # held back until the log-probability check has seen enough tokens
                        if not state.checked:
                            state.checked = True
                            self._refuse_logprobs([list(t.top_logits) for t in state.tokens[:_CHECK_TOKENS]])
                        yield from state.tokens[state.sent :]
                        state.sent = len(state.tokens)
                if not state.checked:
                    self._refuse_logprobs([list(t.top_logits) for t in state.tokens])
                yield from state.tokens[state.sent :]
                state.sent = len(state.tokens)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc

    def _prompt_scores(self, summary: Any) -> tuple[TokenScore, ...]:
        """The question's tokens scored at the server's prefill (``logtoku.prompt_scores``), AU/EU recomputed
        here from their raw logits; ``()``, said once with a warning, when the server sends none."""
        scored = (summary or {}).get("prompt_scores") if isinstance(summary, dict) else None
        if not scored:
            if not self._warned_prompt:
                self._warned_prompt = True
                warnings.warn(
                    f"{self._url} sends no prompt scores (the question's own token scores; logtoku-guard serve does, "
                    "vLLM does not): the guard's prompt_* statistics are undefined, and a fitted guard scores them as "
                    "its fit data's means, so guard_score differs from a local backend's",
                    MissingPromptScoresWarning,
                    stacklevel=4,
                )
            return ()
        entries = [proto.ChatTokenLogprob(token=t["token"], logprob=t["logprob"], logtoku=t) for t in scored]
        return tuple(self._tokens(entries, check=False))

    def _generation(
        self,
        messages: list[ChatMessage],
        text: str,
        tokens: list[TokenScore],
        finish: Any,
        stop: Any,
        prompt_tokens: int,
        timings: Timings,
        prompt_scores: tuple[TokenScore, ...] = (),
    ) -> Generation:
        reason: FinishReason = "length" if finish == "length" else "cancelled" if finish == "abort" else "stop"
        return Generation(
            model=self._model,
            prompt=question_of(messages),
            text=text,
            tokens=tuple(tokens),
            finish_reason=reason,
            k=self._k,
            evidence=self._evidence,
            top_n=self._top_n,
            prompt_tokens=prompt_tokens,
            stop_sequence=stop if isinstance(stop, str) else None,
            timings=timings,
            prompt_scores=prompt_scores,
        )


MAX_MODELS_BYTES = 1 << 20
"""The most of a ``GET /models`` answer :func:`served_models` reads."""


def served_models(base_url: str, api_key: str | None = None, *, timeout: float = 30.0) -> list[str]:
    """The model names an OpenAI-compatible server lists at ``GET {base_url}/models`` (bounded read)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/models"
    try:
        with httpx.Client(timeout=timeout) as client, client.stream("GET", url, headers=headers) as response:
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_MODELS_BYTES:
                    msg = f"{url} sent more than {MAX_MODELS_BYTES} bytes for its model list; name the model with --model"
                    raise RemoteServerError(msg)
            status = response.status_code
    except httpx.HTTPError as exc:
        msg = f"cannot reach {url}: {exc}; is the server running (logtoku-guard serve) and the address right?"
        raise RemoteServerError(msg) from exc
    if status != 200:
        msg = f"{url} answered HTTP {status}; check --base-url and the key (LOGTOKU_GUARD_REMOTE_API_KEY or OPENAI_API_KEY)"
        raise RemoteServerError(msg)
    try:
        listed = proto.ModelList.model_validate_json(body)
    except ValueError as exc:
        msg = f"{url} did not send an OpenAI model list ({exc.__class__.__name__}); name the model with --model"
        raise RemoteServerError(msg) from exc
    return [m.id for m in listed.data]
