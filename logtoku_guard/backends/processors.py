"""Logits processors, shaped like transformers' (``__call__(input_ids, scores) -> scores``).

:class:`DynamicTemperatureLogitsWarper` samples each step at the temperature that
:class:`~logtoku_guard.types.DynamicTemperature` gives for that step's epistemic uncertainty
(as in the paper, Ma et al. 2025). It never reads the model: the EU comes from a callable (the backend wires
the step recorder's, computed on the raw logits), so it is tested on hand-built tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.types import DynamicTemperature

if TYPE_CHECKING:
    import torch


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
