"""The standard OpenAI request fields beyond sampling: honoured on the logits, refused by name, or ignored by spec.

:class:`StandardParams` is the base of both endpoints' requests (:mod:`logtoku_guard.wire.openai_protocol`):
``logit_bias`` and the ``frequency_penalty``/``presence_penalty`` act on the logits that choose the
next token (:mod:`logtoku_guard.backends.processors`); the identifiers and cache hints OpenAI
describes as not changing the answer are accepted and ignored; ``store`` and ``service_tier`` take
only what this server does; every other standard field it cannot honour (:data:`REFUSED`) is a
400 naming it, never accepted and ignored. No web framework is imported here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator, model_validator

from logtoku_guard.errors import short_repr
from logtoku_guard.wire.openai_errors import WireValueError

__all__ = ["MAX_STOP", "REFUSED", "StandardParams"]

MAX_STOP = 4
"""OpenAI's most ``stop`` strings."""

REFUSED = {
    "functions": "the legacy functions API; send tools (and tool_choice) instead",
    "function_call": "the legacy functions API; send tool_choice (with tools) instead",
    "audio": "this server answers in text only; leave it out",
    "modalities": 'this server answers in text only; send ["text"] or leave it out',
    "prediction": "predicted outputs are not implemented; leave it out",
    "web_search_options": "this server has no web search; leave it out",
    "reasoning_effort": "the served model is not a reasoning model; leave it out",
    "verbosity": "the served model has no verbosity setting; leave it out",
    "moderation": "this server runs no moderation (its guard is the --policy, its decision in logtoku_guard); leave it out",
}
"""Standard chat-completions fields this server refuses (a 400 naming the field) when they are set."""


class StandardParams(BaseModel):
    """The standard fields both endpoints share beyond sampling (see the module)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    logit_bias: dict[StrictStr, float] | None = Field(
        default=None,
        description="Token id (as a string) -> bias from -100 to 100, added to the token's logit before the next token "
        "is chosen (-100 bans it, 100 forces it). The guard scores the raw logits, before any bias.",
    )
    frequency_penalty: float | None = Field(
        default=None,
        ge=-2,
        le=2,
        allow_inf_nan=False,
        description="From -2 to 2: each token's logit is lowered by this times how often it already appears in the answer.",
    )
    presence_penalty: float | None = Field(
        default=None,
        ge=-2,
        le=2,
        allow_inf_nan=False,
        description="From -2 to 2: each token's logit is lowered by this once it appears in the answer.",
    )
    user: StrictStr | None = Field(
        default=None, description="Accepted and ignored (an end-user id; it does not change the answer)."
    )
    safety_identifier: StrictStr | None = Field(default=None, description="Accepted and ignored (as user).")
    prompt_cache_key: StrictStr | None = Field(
        default=None, description="Accepted and ignored (a cache hint; this server caches prompt prefixes by itself)."
    )
    prompt_cache_retention: StrictStr | None = Field(default=None, description="Accepted and ignored (as prompt_cache_key).")
    prompt_cache_options: dict[StrictStr, Any] | None = Field(
        default=None, description="Accepted and ignored (as prompt_cache_key)."
    )
    metadata: dict[StrictStr, StrictStr] | None = Field(
        default=None, description="Accepted and ignored (tags of a stored completion; this server stores none)."
    )
    store: StrictBool | None = Field(default=None, description="Only false: this server does not store completions.")
    service_tier: StrictStr | None = Field(default=None, description="Only 'auto' or 'default': this server has one tier.")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        """A standard OpenAI field this server cannot honour is a 400 naming it, never accepted and ignored."""
        if isinstance(data, dict):
            for name, why in REFUSED.items():
                value = data.get(name)
                if name in data and value is not None and not (name == "modalities" and value == ["text"]):
                    raise WireValueError(f"{name}={short_repr(value)} is not supported by this server: {why}", name)
        return data

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdigit() or not key.isascii():
                msg = f'logit_bias keys must be token ids written as strings (e.g. {{"1234": -100}}), got {short_repr(key)}'
                raise WireValueError(msg, "logit_bias")
            if not -100 <= value <= 100:
                msg = f"logit_bias[{key!r}]={short_repr(value)} is outside -100 to 100; send a bias from -100 to 100"
                raise WireValueError(msg, "logit_bias")
        return bias

    @field_validator("store")
    @classmethod
    def _no_store(cls, store: bool | None) -> bool | None:
        if store:
            raise WireValueError("store=true is not supported: this server does not store completions; leave it out", "store")
        return store

    @field_validator("service_tier")
    @classmethod
    def _one_tier(cls, tier: str | None) -> str | None:
        if tier not in (None, "auto", "default"):
            msg = f"service_tier={short_repr(tier)} is not supported: this server has one tier; send 'auto' or leave it out"
            raise WireValueError(msg, "service_tier")
        return tier

    @property
    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as ``(token id, bias)`` pairs, ids ascending (for :class:`~logtoku_guard.types.DecodingOptions`)."""
        return tuple(sorted((int(k), float(v)) for k, v in (self.logit_bias or {}).items()))
