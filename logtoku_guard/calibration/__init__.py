"""Thresholds from data, never constants: model profiles, threshold fitting, calibration prompts.

* :mod:`~logtoku_guard.calibration.profiles`: :class:`ModelProfile` (quantile grids of one
  model's token AU/EU and response statistics), :func:`calibrate`, :func:`build_profile`,
  where profiles are kept (:func:`profile_path`, :func:`load_profile_for`);
* :mod:`~logtoku_guard.calibration.thresholds`: :func:`fit_threshold` on labelled answers;
* :mod:`~logtoku_guard.calibration.prompts`: the default calibration questions
  (:func:`default_calibration_prompts`) or a prompts file (:func:`read_prompts_file`).

The datasets behind the default prompts are read by :mod:`logtoku_guard.evaluation.datasets`.
"""

from __future__ import annotations

from logtoku_guard.calibration.profiles import (
    GRID,
    PROFILE_VERSION,
    ModelProfile,
    build_profile,
    calibrate,
    load_profile_for,
    profile_path,
)
from logtoku_guard.calibration.prompts import default_calibration_prompts, read_prompts_file
from logtoku_guard.calibration.thresholds import ThresholdFit, fit_threshold
from logtoku_guard.evaluation.datasets import DATA_ENV
from logtoku_guard.evaluation.datasets import existing_data_dir as shared_data_dir

__all__ = [
    "DATA_ENV",
    "GRID",
    "PROFILE_VERSION",
    "ModelProfile",
    "ThresholdFit",
    "build_profile",
    "calibrate",
    "default_calibration_prompts",
    "fit_threshold",
    "load_profile_for",
    "profile_path",
    "read_prompts_file",
    "shared_data_dir",
]
