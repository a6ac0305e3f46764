"""Thresholds from data, never constants: model profiles, threshold fitting, calibration prompts.

* :mod:`~logtoku_guard.calibration.profiles`: :class:`ModelProfile` (quantile grids of one
  model's token AU/EU and response statistics), :func:`calibrate`, :func:`build_profile`,
  where profiles are kept (:func:`profile_path`, :func:`load_profile_for`);
* :mod:`~logtoku_guard.calibration.thresholds`: :func:`fit_threshold` on labelled answers;
* :mod:`~logtoku_guard.calibration.prompts`: the default calibration questions
  (:func:`default_calibration_prompts`) or a prompts file (:func:`read_prompts_file`);
* :mod:`~logtoku_guard.calibration.datasets`: TruthfulQA and NQ-open read in place (calibration
  prompts picked from the full files, and the evaluation harness's QA datasets).

The default prompts ship in ``calibration/data/`` with their datasets' licences.
"""

from __future__ import annotations

from logtoku_guard.calibration.profiles import (
    GRID,
    PROFILE_VERSION,
    ModelProfile,
    build_profile,
    calibrate,
    find_profile_for,
    load_profile_for,
    profile_path,
    shipped_profile_path,
)
from logtoku_guard.calibration.prompts import (
    CALIBRATION_QUESTIONS,
    CalibrationQuestion,
    default_calibration_prompts,
    read_prompts_file,
    shipped_calibration_questions,
)
from logtoku_guard.calibration.thresholds import ThresholdFit, fit_threshold

__all__ = [
    "CALIBRATION_QUESTIONS",
    "GRID",
    "PROFILE_VERSION",
    "CalibrationQuestion",
    "ModelProfile",
    "ThresholdFit",
    "build_profile",
    "calibrate",
    "default_calibration_prompts",
    "find_profile_for",
    "fit_threshold",
    "load_profile_for",
    "profile_path",
    "read_prompts_file",
    "shipped_calibration_questions",
    "shipped_profile_path",
]
