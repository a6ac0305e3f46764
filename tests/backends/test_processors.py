"""DynamicTemperatureLogitsWarper on hand-built tensors: exact temperatures, no model.

Schedule t_min=0.25, t_max=1, power=2: T(e) = 0.25 + 0.75 * (1 - e)^2, exact in binary for
the EU values used (0 -> 1, 0.5 -> 0.4375, 1 -> 0.25; EU outside [0, 1] is clamped first).
"""

from __future__ import annotations

import pytest
import torch

from logtoku_guard import ConfigurationError, DynamicTemperature
from logtoku_guard.backends.processors import DynamicTemperatureLogitsWarper
from logtoku_guard.backends.recorder import StepRecorder

SCHEDULE = DynamicTemperature(t_max=1.0, t_min=0.25, power=2.0)
EU = torch.tensor([0.0, 0.5, 1.0, 1.5, -0.5])
EXPECTED = [1.0, 0.4375, 0.25, 0.25, 1.0]


def test_temperatures_are_the_formula_exactly() -> None:
    assert SCHEDULE.temperatures(EU).tolist() == EXPECTED
    assert [SCHEDULE.temperature(float(e)) for e in EU] == EXPECTED  # scalar and tensor forms agree
    assert SCHEDULE.temperatures(EU.double()).dtype == torch.float64


def test_warper_divides_each_row_by_its_temperature() -> None:
    scores = torch.tensor([[1.0, -2.0, 0.5]] * 5)
    seen: list[torch.Tensor] = []
    warper = DynamicTemperatureLogitsWarper(SCHEDULE, eu=lambda: EU, on_temperatures=seen.append)
    out = warper(torch.zeros((5, 3), dtype=torch.long), scores)
    assert out.shape == (5, 3) and out.dtype == torch.float32
    assert torch.equal(out, scores / torch.tensor(EXPECTED)[:, None])
    assert out[0].tolist() == [1.0, -2.0, 0.5] and out[2].tolist() == [4.0, -8.0, 2.0]
    assert len(seen) == 1 and seen[0].tolist() == EXPECTED
    assert scores.tolist() == [[1.0, -2.0, 0.5]] * 5  # the input is not modified


def test_warper_keeps_the_scores_dtype() -> None:
    scores = torch.tensor([[4.0, 2.0], [4.0, 2.0]], dtype=torch.bfloat16)
    out = DynamicTemperatureLogitsWarper(SCHEDULE, eu=lambda: torch.tensor([0.0, 1.0]))(
        torch.zeros((2, 1), dtype=torch.long), scores
    )
    assert out.dtype == torch.bfloat16 and out.tolist() == [[4.0, 2.0], [16.0, 8.0]]


def test_power_one_is_linear_in_eu() -> None:
    linear = DynamicTemperature(t_max=2.0, t_min=0.5, power=1.0)
    assert linear.temperatures(torch.tensor([0.0, 0.5, 1.0])).tolist() == [2.0, 1.25, 0.5]


def test_warper_validates_its_schedule() -> None:
    with pytest.raises(ConfigurationError, match=r"DynamicTemperature\(t_max=\.\.\., t_min=\.\.\.\), got 0\.5"):
        DynamicTemperatureLogitsWarper(0.5, eu=lambda: EU)  # type: ignore[arg-type]


def test_recorder_gives_the_raw_eu_and_keeps_the_temperatures() -> None:
    """Wired as the backend wires it: EU from the recorder's raw-logit step, temperatures back to it."""
    recorder = StepRecorder(
        k=2, evidence="clamped", tokenizer=None, rows=2, stop=(), eos_ids=frozenset(), on_token=None, cancel=None
    )
    warper = DynamicTemperatureLogitsWarper(SCHEDULE, recorder.current_eu, recorder.record_temperatures)
    with pytest.raises(RuntimeError, match="before its logits were recorded"):
        warper(torch.zeros((2, 1), dtype=torch.long), torch.zeros((2, 4)))

    class Output:
        logits = torch.tensor([[[3.0, 1.0, 0.0, -1.0]], [[0.0, 0.0, -1.0, -2.0]]])

    recorder.hook(None, None, Output())
    # EU = K / sum(max(z, 0) + 1): row 0 -> 2 / 6 = 1/3, row 1 -> 2 / 2 = 1
    warper(torch.zeros((2, 1), dtype=torch.long), torch.zeros((2, 4)))
    assert recorder.temperatures is not None
    assert recorder.temperatures.tolist() == pytest.approx([0.25 + 0.75 * (2 / 3) ** 2, 0.25])
