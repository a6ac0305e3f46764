"""The logits processors of the decode loop, shaped like transformers' (``__call__(input_ids, scores) -> scores``).

**The model's own.** :func:`row_processors` and :func:`sampling_warpers` build, from transformers'
public ``LogitsProcessor`` classes, the processors that ``generate`` derives from a model's
``GenerationConfig``, in the order ``generate`` applies them: first the ones that read a row's
tokens (``sequence_bias``, the repetition penalties, ``no_repeat_ngram_size``, ``bad_words_ids``,
``min_length``/``min_new_tokens``, the forced and suppressed tokens, the length penalty), run per
row on that row's own prompt and answer; then, when sampling, the row-wise warpers (temperature,
top-h, top-k, top-p, min-p, typical, epsilon and eta cut-offs), run on the whole batch, and
``renormalize_logits`` last. A config that asks for what a single decode pass cannot apply
(classifier-free guidance, watermarking) is refused by :func:`check_generation_config`.

**The request's.** :func:`request_processors` builds, per row, what an OpenAI request asks of the
logits: ``logit_bias`` (transformers' ``SequenceBiasLogitsProcessor``, one-token sequences) and the
``frequency_penalty``/``presence_penalty`` (:class:`OpenAIPenaltiesLogitsProcessor`, as OpenAI and
vLLM define them: over the tokens of the answer so far, not the prompt);
:func:`penalise_row` is the same for one numpy row (the llama.cpp loop). Both act on a copy of the
logits that choose the next token, after the step's raw logits were recorded: AU/EU, log p and the
guard's scores stay the model's own. :func:`unsupported_logit_param` names the one a backend cannot apply
(:data:`LOGIT_PARAMS`), for the server's 400.

**The draw.** :func:`draw` picks a sampled row's token from its processed logits with the row's own
random stream (an exponential race: robust to the float differences of a batched forward pass).

**Ours.** :class:`DynamicTemperatureLogitsWarper` samples each step at the temperature that
:class:`~logtoku_guard.types.DynamicTemperature` gives for that step's epistemic uncertainty
(as in the paper, Ma et al. 2025). It never reads the model: the EU comes from a callable (the backend wires
the step recorder's, computed on the raw logits), so it is tested on hand-built tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from logtoku_guard.errors import ConfigurationError, short_repr
from logtoku_guard.types import DecodingOptions, DynamicTemperature

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    from logtoku_guard.backends.base import Backend

__all__ = [
    "LOGIT_PARAMS",
    "DynamicTemperatureLogitsWarper",
    "OpenAIPenaltiesLogitsProcessor",
    "check_generation_config",
    "draw",
    "penalise_row",
    "request_processors",
    "row_processors",
    "sampling_warpers",
    "unsupported_logit_param",
]


LOGIT_PARAMS = ("logit_bias", "frequency_penalty", "presence_penalty")
"""The request's logit parameters (:class:`~logtoku_guard.types.DecodingOptions`), applied by a backend
whose class sets ``honours_logit_params = True``, refused on any other (:func:`unsupported_logit_param`)."""


def unsupported_logit_param(options: DecodingOptions, backend: Backend) -> str | None:
    """The first logit parameter ``options`` sets that ``backend`` cannot apply (one whose class does not
    set ``honours_logit_params``), else None: the server answers it with a 400 naming it."""
    names = options.logit_params
    return names[0] if names and not getattr(backend, "honours_logit_params", False) else None


_UNSUPPORTED = {
    "guidance_scale": "classifier-free guidance needs a second, unconditional forward pass per step",
    "watermarking_config": "watermarking keeps per-sequence state the batched decode loop does not give it",
}


def check_generation_config(config: GenerationConfig) -> None:
    """Raise :class:`~logtoku_guard.errors.ConfigurationError` when ``config`` sets a field the decode loop cannot apply.

    Those are ``guidance_scale`` (other than 1) and ``watermarking_config``; the message names
    the field and how to unset it.
    """
    for name, why in _UNSUPPORTED.items():
        value = getattr(config, name, None)
        if value is None or (name == "guidance_scale" and value == 1):
            continue
        msg = (
            f"the model's generation_config sets {name}={short_repr(value)}, which logtoku_guard's decode loop "
            f"does not apply ({why}); unset it (model.generation_config.{name} = None) before passing the model"
        )
        raise ConfigurationError(msg)


def _eos_tensor(config: GenerationConfig, device: Any) -> torch.Tensor | None:
    """The config's end-of-sequence ids as a 1-D long tensor (None when it has none), as ``generate`` makes it."""
    import torch

    eos = config.eos_token_id
    if eos is None:
        return None
    return torch.as_tensor(eos, dtype=torch.long, device=device).reshape(-1)


def row_processors(config: GenerationConfig, prompt: Sequence[int], max_new_tokens: int, device: Any) -> LogitsProcessorList:
    """The processors ``generate`` applies before sampling, for one row, in ``generate``'s order.

    They read the row's tokens: call the list with that row's ``(1, prompt + answer so far)``
    long ids. ``prompt`` (its ids) is what ``generate`` calls the input: ``min_new_tokens``
    and ``begin_suppress_tokens`` count from its end, the ``encoder_*`` penalties look at it;
    ``max_new_tokens`` places ``forced_eos_token_id`` on the row's last token.
    """
    import torch
    from transformers import (
        EncoderNoRepeatNGramLogitsProcessor,
        EncoderRepetitionPenaltyLogitsProcessor,
        ExponentialDecayLengthPenalty,
        ForcedBOSTokenLogitsProcessor,
        ForcedEOSTokenLogitsProcessor,
        InfNanRemoveLogitsProcessor,
        LogitsProcessorList,
        MinLengthLogitsProcessor,
        MinNewTokensLengthLogitsProcessor,
        NoBadWordsLogitsProcessor,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    check_generation_config(config)
    c = config
    n = len(prompt)
    ids = cast("torch.LongTensor", torch.tensor([list(prompt)], dtype=torch.long, device=device))
    eos = _eos_tensor(c, device)
    out = LogitsProcessorList()
    if c.sequence_bias is not None:
        out.append(SequenceBiasLogitsProcessor(sequence_bias=c.sequence_bias))
    if c.encoder_repetition_penalty is not None and c.encoder_repetition_penalty != 1.0:
        out.append(EncoderRepetitionPenaltyLogitsProcessor(penalty=c.encoder_repetition_penalty, encoder_input_ids=ids))
    if c.repetition_penalty is not None and c.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(penalty=c.repetition_penalty))
    if c.no_repeat_ngram_size is not None and c.no_repeat_ngram_size > 0:
        out.append(NoRepeatNGramLogitsProcessor(c.no_repeat_ngram_size))
    if c.encoder_no_repeat_ngram_size is not None and c.encoder_no_repeat_ngram_size > 0:
        out.append(EncoderNoRepeatNGramLogitsProcessor(c.encoder_no_repeat_ngram_size, ids))
    if c.bad_words_ids is not None:
        out.append(NoBadWordsLogitsProcessor(c.bad_words_ids, eos))
    if c.min_length is not None and eos is not None and c.min_length > 0:
        out.append(MinLengthLogitsProcessor(c.min_length, eos, device=device))
    if c.min_new_tokens is not None and eos is not None and c.min_new_tokens > 0:
        out.append(MinNewTokensLengthLogitsProcessor(n, c.min_new_tokens, eos, device=device))
    if c.forced_bos_token_id is not None:
        out.append(ForcedBOSTokenLogitsProcessor(c.forced_bos_token_id))
    if c.forced_eos_token_id is not None:
        out.append(ForcedEOSTokenLogitsProcessor(n + max_new_tokens, c.forced_eos_token_id, device=device))
    if c.remove_invalid_values is True:
        out.append(InfNanRemoveLogitsProcessor())
    if c.exponential_decay_length_penalty is not None and eos is not None:  # it raises EOS: nothing without one
        out.append(ExponentialDecayLengthPenalty(c.exponential_decay_length_penalty, eos, n))
    if c.suppress_tokens is not None:
        out.append(SuppressTokensLogitsProcessor(c.suppress_tokens, device=device))
    if c.begin_suppress_tokens is not None:
        begin = n if (n > 1 or c.forced_bos_token_id is None) else n + 1
        out.append(SuppressTokensAtBeginLogitsProcessor(c.begin_suppress_tokens, begin, device=device))
    return out


def sampling_warpers(config: GenerationConfig, device: Any, first: Sequence[Any] = ()) -> LogitsProcessorList:
    """The row-wise processors ``generate`` applies after :func:`row_processors`, in its order.

    ``first`` (our own, e.g. :class:`DynamicTemperatureLogitsWarper`), then, when
    ``config.do_sample``: temperature, top-h, top-k, top-p, min-p, typical, epsilon and eta
    cut-offs (one sequence per prompt: ``min_tokens_to_keep=1``); ``LogitNormalization`` last
    when ``renormalize_logits``. None reads the tokens: call the list on the whole batch.
    """
    from transformers import (
        EpsilonLogitsWarper,
        EtaLogitsWarper,
        LogitNormalization,
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopHLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
        TypicalLogitsWarper,
    )

    check_generation_config(config)
    c = config
    out = LogitsProcessorList(first)
    if c.do_sample:
        if c.temperature is not None and c.temperature != 1.0:
            out.append(TemperatureLogitsWarper(c.temperature))
        if getattr(c, "top_h", None) is not None:
            out.append(TopHLogitsWarper(top_h=c.top_h))
        if c.top_k is not None and c.top_k != 0:
            out.append(TopKLogitsWarper(top_k=c.top_k))
        if c.top_p is not None and c.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=c.top_p))
        if c.min_p is not None:
            out.append(MinPLogitsWarper(min_p=c.min_p))
        if c.typical_p is not None and c.typical_p < 1.0:
            out.append(TypicalLogitsWarper(mass=c.typical_p))
        if c.epsilon_cutoff is not None and 0.0 < c.epsilon_cutoff < 1.0:
            out.append(EpsilonLogitsWarper(epsilon=c.epsilon_cutoff))
        if c.eta_cutoff is not None and 0.0 < c.eta_cutoff < 1.0:
            out.append(EtaLogitsWarper(epsilon=c.eta_cutoff, device=device))
    if c.renormalize_logits is True:
        out.append(LogitNormalization())
    return out


def draw(scores: torch.Tensor, generator: torch.Generator) -> int:
    """A sampled row's next token: drawn from its processed ``(1, vocab)`` ``scores`` with its own ``generator``.

    An exponential race (the Gumbel-max trick): the token maximising ``p_i / E_i``, one ``E_i ~ Exp(1)``
    per vocabulary entry from ``generator``; this is what ``torch.multinomial(p, 1)`` computes, spelt
    out so that it cannot change under us. Every draw advances the row's stream by the same amount,
    whatever its probabilities, so a seeded row's draws depend on its own steps only. A float
    difference of ``d`` in the logits (a batched forward pass: ~1e-5 on the tiny test model) moves
    each race value by a factor of at most ``exp(2d/T)``: the draw changes only when the best two
    are that close, about ``2d/T`` of draws, where an inverse-CDF draw over the vocabulary sums the
    differences of every token before the drawn one (1.2% of draws flipped at ``d = 1e-5`` on a
    49,152-token vocabulary in a simulation, none with the race). Non-finite scores draw uniformly
    (the recorder ends that row with the error).
    """
    import torch

    probs = torch.softmax(scores, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        probs = torch.ones_like(probs)
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return int(torch.argmax(probs / race, dim=-1)[0])


class DynamicTemperatureLogitsWarper:
    """Divide each row's scores by ``T(EU_t)``, the temperature of the current step's EU.

    Placed after the model's built-in pre-processors (repetition penalty...) and before the
    sampling warpers (top-p), as transformers places ``TemperatureLogitsWarper``.

    Args:
        schedule: the :class:`~logtoku_guard.types.DynamicTemperature` (``t_min``, ``t_max``,
            ``power``) that maps EU to a temperature.
        eu: returns the current step's EU, a ``(batch,)`` float tensor computed from the
            *raw* logits (the scores this processor sees may already be penalised).
        on_temperatures: called with the ``(batch,)`` temperatures of each step (optional).

    Call: ``input_ids`` ``(batch, seq_len)`` long (unused), ``scores`` ``(batch, vocab)``
    float; returns ``(batch, vocab)`` scores of the same dtype, row ``b`` divided by
    ``T(eu[b])``.
    """

    def __init__(
        self,
        schedule: DynamicTemperature,
        eu: Callable[[], torch.Tensor],
        on_temperatures: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        if not isinstance(schedule, DynamicTemperature):
            msg = f"schedule must be a DynamicTemperature(t_max=..., t_min=...), got {schedule!r}"
            raise ConfigurationError(msg)
        self.schedule = schedule
        self.eu = eu
        self.on_temperatures = on_temperatures

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        temperatures = self.schedule.temperatures(self.eu())
        if self.on_temperatures is not None:
            self.on_temperatures(temperatures)
        return scores / temperatures[:, None].to(device=scores.device, dtype=scores.dtype)  # type: ignore[return-value]


def request_processors(options: DecodingOptions, prompt_length: int) -> list[Any]:
    """The processors ``options``' logit parameters ask for, for one row whose prompt is ``prompt_length``
    tokens: call each with that row's ``(1, prompt + answer so far)`` ids, as :func:`row_processors`.
    Empty when none is set."""
    out: list[Any] = []
    if options.frequency_penalty or options.presence_penalty:
        out.append(OpenAIPenaltiesLogitsProcessor(options.frequency_penalty, options.presence_penalty, prompt_length))
    if options.logit_bias:
        from transformers import SequenceBiasLogitsProcessor

        out.append(SequenceBiasLogitsProcessor(sequence_bias=[[[token], bias] for token, bias in options.logit_bias]))
    return out


class OpenAIPenaltiesLogitsProcessor:
    """OpenAI's ``frequency_penalty`` and ``presence_penalty`` over the answer's tokens.

    ``logit[j] -= frequency * count[j] + presence * (count[j] > 0)``, ``count[j]``: how often token ``j``
    appears among the ids after the first ``prompt_length`` (the answer so far; the prompt is not
    penalised, as vLLM and OpenAI do). Call: ``input_ids`` ``(batch, seq_len)`` long, ``scores``
    ``(batch, vocab)`` float; returns new scores (the input is left as it is).
    """

    def __init__(self, frequency: float, presence: float, prompt_length: int) -> None:
        self.frequency = float(frequency)
        self.presence = float(presence)
        self.prompt_length = int(prompt_length)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        import torch

        answer = input_ids[:, self.prompt_length :]
        if answer.shape[-1] == 0:
            return scores
        counts = torch.zeros_like(scores).scatter_add_(1, answer.to(scores.device), torch.ones_like(answer, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)  # type: ignore[return-value]


def penalise_row(logits: np.ndarray, answer: Sequence[int], options: DecodingOptions) -> np.ndarray:
    """One row's logits with ``options``' logit bias and penalties applied (a new float32 array; ``answer``:
    the ids generated so far). As :func:`request_processors`, for the numpy decode loop (llama.cpp)."""
    import numpy as np

    out = np.array(logits, dtype=np.float32, copy=True)
    if answer and (options.frequency_penalty or options.presence_penalty):
        counts = np.bincount(np.asarray(answer, dtype=np.int64), minlength=out.shape[-1])[: out.shape[-1]].astype(np.float32)
        out -= np.float32(options.frequency_penalty) * counts + np.float32(options.presence_penalty) * (counts > 0)
    for token, bias in options.logit_bias:
        if token < out.shape[-1]:
            out[token] += np.float32(bias)
    return out
