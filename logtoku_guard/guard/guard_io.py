"""``BackendIO``: the guard loop's requests answered with a backend and a retriever.

The driver (:mod:`logtoku_guard.guard.driver`) asks; this answers, for
:class:`~logtoku_guard.guard.guard.Guard` (and LangChain's ``LogTokUGuard``, whose backend is its chat
model): a :class:`~logtoku_guard.guard.guard_steps.Generate` with the backend (the retrieved context in
the last user turn, trimmed passage by passage while the prompt is too long for the model's
window; token by token through ``backend.stream`` while the driver's
:class:`~logtoku_guard.guard.driver.Watch` watches ``early_stop`` rules, else ``backend.generate``), a
:class:`~logtoku_guard.guard.guard_steps.Retrieve` with the retriever (in a worker thread with the
policy's timeout: :func:`~logtoku_guard.guard.retriever_calls.call_retriever`), a live
:class:`~logtoku_guard.guard.driver.Draft` over ``backend.stream``, and a
:class:`~logtoku_guard.guard.guard_steps.Measure` (the second looks a policy rule reached) with the
backend again: the verification prefill of the self-check (``backend.generate``, one token), the
samples and the reworded questions (``backend.batch``, rows of one batch). Their samples stay here:
only the statistics, cost and inputs go back (:mod:`logtoku_guard.scoring.second_look`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from logtoku_guard.errors import ConfigurationError, PromptTooLongError
from logtoku_guard.guard.driver import Watch
from logtoku_guard.guard.guard_steps import Answer, Generate, Measure, Measured, Retrieve, Retrieved
from logtoku_guard.guard.retriever_calls import RetrieverLike, call_retriever
from logtoku_guard.scoring.second_look import Look, Measurement, agreement, claim_key, looks_stats, verdict
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, TokenScore

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend, TokenStream
    from logtoku_guard.decision.policy import Policy, RetrieveSettings

__all__ = ["BackendIO", "TokenDraft", "retrieve_passages"]


def retrieve_passages(retriever: RetrieverLike | None, request: Retrieve, settings: RetrieveSettings) -> Retrieved:
    """The answer to ``request`` from ``retriever`` (at most ``settings.passages`` passages, waiting at
    most ``settings.timeout_s``), or none and why: no retriever, an empty result, a timeout, or the
    retriever's exception (logged and recorded, never swallowed silently)."""
    if retriever is None:
        return Retrieved(why="no retriever configured")
    passages, why = call_retriever(retriever, request.question, settings.timeout_s, settings.passages)
    return Retrieved(tuple(passages), why)


class _Generating(Protocol):
    """What :meth:`BackendIO.of` reads (a :class:`~logtoku_guard.guard.guard.Guard` has it)."""

    @property
    def backend(self) -> Backend: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def retriever(self) -> RetrieverLike | None: ...

    @property
    def options(self) -> DecodingOptions: ...


class BackendIO:
    """Answer one question's requests: generate with ``backend`` from ``messages`` (the question's
    chat turns), retrieve with ``retriever`` (at most ``settings.passages`` passages, waiting at
    most ``settings.timeout_s``)."""

    def __init__(
        self,
        backend: Backend,
        messages: Sequence[ChatMessage],
        settings: RetrieveSettings,
        *,
        retriever: RetrieverLike | None = None,
        options: DecodingOptions | None = None,
    ) -> None:
        self.backend = backend
        self.messages = list(messages)
        self.settings = settings
        self.retriever = retriever
        self.options = options

    @classmethod
    def of(cls, guard: _Generating, messages: Sequence[ChatMessage]) -> BackendIO:
        """The I/O of ``guard`` (its backend, options, retriever and retrieve settings) for ``messages``."""
        return cls(guard.backend, messages, guard.policy.retrieve, retriever=guard.retriever, options=guard.options)

    def generate(self, request: Generate, watch: Watch | None = None) -> Answer:
        """The first answer from the messages as they are; a later one with the retrieved context
        in place of the last user turn. When that prompt is too long for the model's window
        (:class:`PromptTooLongError`), the last passage is dropped and the model asked again;
        the answer's ``note`` says so ("context too long for the model's window: ..."), and its
        generation is None when not even one passage fits. Each token goes to ``watch`` (when it
        watches a rule), which may stop the generation."""
        watch = watch if watch is not None else Watch()
        if request.first:
            return Answer(self._generate(self.messages, watch))
        kept = list(request.passages)
        error: PromptTooLongError | None = None
        while kept:
            augmented = [*self.messages[:-1], ChatMessage("user", request.prompt(kept))]
            try:
                generation = self._generate(augmented, watch)
            except PromptTooLongError as exc:
                error = exc
                kept.pop()
                continue
            note = None
            if error is not None:
                note = (
                    f"context too long for the model's window: kept {len(kept)} of {len(request.passages)} passage(s) ({error})"
                )
            return Answer(generation, tuple(kept), note)
        return Answer(None, note=f"context too long for the model's window: {error}")

    def retrieve(self, request: Retrieve) -> Retrieved:
        """Passages for the question from the retriever (:func:`retrieve_passages`)."""
        return retrieve_passages(self.retriever, request, self.settings)

    def draft(self, request: Generate, watch: Watch) -> TokenDraft:
        """The answer to ``request`` streamed token by token (the first answer of a live run)."""
        if not request.first:
            msg = "BackendIO streams the first answer only; a later one is made with its context by generate()"
            raise ValueError(msg)
        return TokenDraft(self.backend.stream(self.messages, self.options), watch)

    def measure(self, request: Measure) -> Measured:
        """The second looks of ``request``, each with the backend (one :class:`Measurement` per look)."""
        return Measured(tuple(self._look(request, look) for look in request.looks))

    def _turns(self, request: Measure, question: str) -> list[ChatMessage]:
        """The question's chat turns with ``question`` as the last user turn (in the retrieval template after a retrieval)."""
        text = question
        if request.retrieve is not None and request.passages:
            text = request.retrieve.prompt(question, request.passages)
        return [*self.messages[:-1], ChatMessage("user", text)]

    def _look(self, request: Measure, look: Look) -> Measurement:
        settings, answer, started = request.settings, request.answer, time.perf_counter()
        base = (self.options or DecodingOptions()).replace(dynamic=None)
        values: dict[str, float] = dict.fromkeys(looks_stats(look), math.nan)
        why: str | None = None
        tokens = 0
        try:
            if look == "self_check":
                check = settings.self_check
                turn = check.prompt.format(question=request.question, answer=answer.text.strip())
                generation = self.backend.generate(self._turns(request, turn), base.replace(max_new_tokens=1, temperature=0.0))
                tokens = generation.prompt_tokens + len(generation.tokens)
                if generation.tokens:
                    values, why = verdict(generation.tokens[0], self._text_of, check.yes, check.no, self.backend.evidence)
                else:
                    why = "the model gave no verdict token"
            else:
                key = claim_key(answer.tokens, request.question)
                if look == "sampling":
                    s = settings.sampling
                    options = base.replace(max_new_tokens=s.max_new_tokens, temperature=s.temperature, seed=s.seed)
                    prompts = [self._turns(request, request.question)] * s.n
                else:
                    p = settings.paraphrase
                    options = base.replace(max_new_tokens=p.max_new_tokens, temperature=0.0, seed=None)
                    prompts = [self._turns(request, t.format(question=request.question)) for t in p.templates]
                generations = self.backend.batch(prompts, options)
                tokens = sum(g.prompt_tokens + len(g.tokens) for g in generations)
                values = {f"{look}_agreement": agreement(key, [g.text for g in generations])}
                why = None if key else "the answer asserts no content word beyond the question"
        except PromptTooLongError as exc:
            why = f"the second look does not fit the model's window ({exc})"
        return Measurement(look, values, tokens, time.perf_counter() - started, settings.inputs(look), why)

    def _text_of(self, token_id: int) -> str:
        tokenizer = getattr(self.backend, "tokenizer", None)
        if tokenizer is None or not callable(getattr(tokenizer, "decode", None)):
            msg = (
                f"the self-check reads the verdict's yes/no tokens by their text, and backend {type(self.backend).__name__} "
                "has no tokenizer with decode(); use a local backend (transformers, llama.cpp) or a policy without "
                "self_check_* rules"
            )
            raise ConfigurationError(msg)
        return str(tokenizer.decode([token_id]))

    def _generate(self, messages: list[ChatMessage], watch: Watch) -> Generation:
        if not watch.watching:
            return self.backend.generate(messages, self.options)
        draft = TokenDraft(self.backend.stream(messages, self.options), watch)
        for _ in draft:  # a rule that fires stops the generation: its finish_reason is "cancelled"
            pass
        return draft.stream.generation


class TokenDraft:
    """A backend's token stream as a live :class:`~logtoku_guard.guard.driver.Draft`: each token goes to
    the reader, then to ``watch``; a rule that fires stops the generation."""

    def __init__(self, stream: TokenStream, watch: Watch) -> None:
        self.stream = stream
        self.watch = watch

    def __iter__(self) -> Iterator[TokenScore]:
        with self.stream:
            for token in self.stream:
                yield token
                if self.watch.token(token):
                    break

    def close(self) -> None:
        self.stream.close()

    def answer(self) -> Answer:
        return Answer(self.stream.generation)
