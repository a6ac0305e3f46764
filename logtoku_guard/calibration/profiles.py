"""Model profiles: where a model's AU/EU and response statistics fall, so thresholds come from data.

AU/EU live on each model's logit scale, so a threshold means nothing until it is placed in
that model's own distribution. A :class:`ModelProfile` stores, for one model and scoring
setup, the quantile grid (0%, 1%, ..., 100%) of token AU/EU and of every response statistic
of :class:`~logtoku_guard.scoring.stats.ResponseStats` over a calibration set of prompts; a policy
can then say "flag the top 10% of max EU" (``{quantile: 0.9}``). :func:`calibrate` runs a
backend over prompts and builds one (:func:`build_profile`); :func:`profile_path` and
:func:`load_profile_for` keep it next to the model cache; the embedded model's profile also ships
with the package (:func:`shipped_profile_path`), so a fresh install needs no calibration run.

Every grid is finite and sorted (checked on load and construction: a NaN grid would silently
disable every quantile rule on it); a statistic with no finite value over the calibration set
is left out of ``stats``, and a rule on it is refused when the guard is built.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import re
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from logtoku_guard.backends.embedded import cache_root
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.guard_score import GuardModel, with_guard_score
from logtoku_guard.scoring.quadrants import QuadrantThresholds
from logtoku_guard.scoring.stats import STAT_NAMES, ResponseStats
from logtoku_guard.types import DecodingOptions, Generation

if TYPE_CHECKING:
    from logtoku_guard.backends.base import Backend

__all__ = [
    "GRID",
    "PROFILE_VERSION",
    "ModelProfile",
    "build_profile",
    "calibrate",
    "find_profile_for",
    "load_profile_for",
    "profile_path",
    "shipped_profile_path",
]

PROFILE_VERSION = 1
GRID = 101
SHIPPED_DIR = Path(__file__).parent / "data"
"""The package's own data: the default calibration questions, shipped profiles and guard fits."""


class ModelProfile(BaseModel):
    """Distribution of token and response statistics of one model over a calibration set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile_version: int = PROFILE_VERSION
    model: str
    k: int
    evidence: str
    top_n: int
    created_at: str
    n_prompts: int
    n_tokens: int
    source: str
    token_au: list[float] = Field(min_length=GRID, max_length=GRID)
    token_eu: list[float] = Field(min_length=GRID, max_length=GRID)
    stats: dict[str, list[float]]
    guard: GuardModel | None = None
    """The fitted guard score (:mod:`logtoku_guard.scoring.guard_score`); None in profiles made before it
    existed or without labelled data: ``guard_score`` is then unavailable (NaN)."""

    @property
    def guard_available(self) -> bool:
        """Whether this profile can compute ``guard_score`` (it holds a fitted guard model)."""
        return self.guard is not None

    def has_stat(self, stat: str) -> bool:
        """Whether ``stat`` has a usable (not all-NaN) quantile grid in this profile."""
        grid = self.stats.get(stat)
        return grid is not None and any(math.isfinite(v) for v in grid)

    @model_validator(mode="after")
    def _grids_are_finite_and_sorted(self) -> ModelProfile:
        grids = {"token_au": self.token_au, "token_eu": self.token_eu, **self.stats}
        for name, grid in grids.items():
            if len(grid) != GRID:
                msg = f"the profile's {name!r} grid has {len(grid)} points, not {GRID}; re-run `logtoku-guard calibrate`"
                raise ValueError(msg)
            bad = next((i for i, v in enumerate(grid) if not math.isfinite(v)), None)
            if bad is not None:
                msg = (
                    f"the profile's {name!r} grid is not finite (point {bad} is {grid[bad]!r}), so every quantile rule on "
                    f"it would be meaningless; re-run `logtoku-guard calibrate --model {self.model}`"
                )
                raise ValueError(msg)
            if any(b < a for a, b in itertools.pairwise(grid)):
                msg = f"the profile's {name!r} grid is not sorted; re-run `logtoku-guard calibrate --model {self.model}`"
                raise ValueError(msg)
        return self

    def quantile(self, stat: str, q: float) -> float:
        """Value of ``stat`` (a response statistic, ``token_au`` or ``token_eu``) at quantile ``q``."""
        if not 0.0 <= q <= 1.0:
            msg = f"quantile {q!r} must be in [0, 1], e.g. 0.9 for the top 10%"
            raise ConfigurationError(msg)
        grid = self._grid(stat)
        pos = q * (GRID - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, GRID - 1)
        return grid[lo] + (grid[hi] - grid[lo]) * (pos - lo)

    def percentile(self, stat: str, value: float) -> float:
        """Share of the calibration set at or below ``value`` of ``stat``, in [0, 1] (NaN for NaN).

        The inverse of :meth:`quantile` on the stored grid (linear between grid points; the
        middle of a run of equal grid values; 0 or 1 outside the grid).
        """
        grid = self._grid(stat)
        if math.isnan(value):
            return math.nan
        lo, hi = bisect.bisect_left(grid, value), bisect.bisect_right(grid, value)
        if hi == 0:
            return 0.0
        if lo == GRID:
            return 1.0
        if lo < hi:  # equal to grid point(s) lo .. hi-1
            return (lo + hi - 1) / 2 / (GRID - 1)
        pos = lo - 1 + (value - grid[lo - 1]) / (grid[lo] - grid[lo - 1])
        return pos / (GRID - 1)

    def quadrant_thresholds(self, au_quantile: float = 0.5, eu_quantile: float = 0.5) -> QuadrantThresholds:
        return QuadrantThresholds(
            self.quantile("token_au", au_quantile),
            self.quantile("token_eu", eu_quantile),
            source=f"profile of {self.model} (AU q{au_quantile:g}, EU q{eu_quantile:g})",
        )

    def _grid(self, stat: str) -> list[float]:
        if stat == "token_au":
            return self.token_au
        if stat == "token_eu":
            return self.token_eu
        if stat in self.stats:
            return self.stats[stat]
        msg = f"the profile of {self.model!r} has no statistic {stat!r}; known: {sorted(self.stats)} + token_au, token_eu"
        raise ConfigurationError(msg)

    def check_matches(self, model: str, k: int, evidence: str) -> None:
        """Raise if this profile was made for another model or scoring setup."""
        if (self.model, self.k, self.evidence) != (model, k, evidence):
            msg = (
                f"the profile is for model={self.model!r}, k={self.k}, evidence={self.evidence!r} but the backend is "
                f"model={model!r}, k={k}, evidence={evidence!r}; run `logtoku-guard calibrate --model {model} --top-k {k}`"
            )
            raise ConfigurationError(msg)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile to ``path`` (its missing folders made) and return it.

        The JSON is written to a new temporary file in the same folder, then renamed onto
        ``path``: a reader never sees half a profile, and a failure leaves ``path`` as it was
        and no temporary file behind. An existing file at ``path`` is replaced (callers that
        must not replace other data check first, as ``logtoku-guard calibrate --out`` does).
        Raises :class:`ConfigurationError` naming the path when it cannot be written (a folder,
        no permission, a full disk).
        """
        p = Path(path)
        if p.is_dir():
            msg = f"cannot save the profile to {str(p)!r}: it is a folder; pass a file path, e.g. {str(p / 'profile.json')!r}"
            raise ConfigurationError(msg)
        tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(self.model_dump_json(indent=1))
                os.replace(tmp, p)  # never a half-written profile
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as exc:
            msg = (
                f"cannot save the profile to {str(p)!r}: {exc.strerror or exc}; "
                "pass a path in a folder this user can write to, on a disk with space"
            )
            raise ConfigurationError(msg) from exc
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ModelProfile:
        """The profile saved at ``path``; a pydantic ``ValidationError`` (a ValueError) names a
        grid that is not finite or not sorted (re-run calibrate), ConfigurationError a missing file."""
        p = Path(path)
        try:
            return cls.model_validate_json(p.read_text())
        except FileNotFoundError as exc:
            msg = f"no profile at {str(p)!r}; create one with `logtoku-guard calibrate`"
            raise ConfigurationError(msg) from exc


def _safe(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_")


def profile_path(model: str, k: int = 2, evidence: str = "clamped", cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the profile of ``model`` is saved by default (next to the model cache)."""
    return cache_root(cache_dir) / "profiles" / f"{_safe(model)}-k{k}-{evidence}.json"


def shipped_profile_path(model: str, k: int = 2, evidence: str = "clamped") -> Path:
    """Where the package ships a ready profile for this setup (one exists for the embedded model
    at K = 2, clamped evidence)."""
    return SHIPPED_DIR / f"profile-{_safe(model)}-k{k}-{evidence}.json"


def find_profile_for(
    model: str, k: int = 2, evidence: str = "clamped", cache_dir: str | os.PathLike[str] | None = None
) -> tuple[ModelProfile, Path] | None:
    """The profile of ``model`` for this setup and where it was read: the one saved by
    ``logtoku-guard calibrate`` in the cache (:func:`profile_path`) first, else the one shipped
    with the package (:func:`shipped_profile_path`), else None.

    A saved profile that cannot be read raises (pydantic ``ValidationError`` or ``OSError``):
    it is never silently replaced by the shipped one.
    """
    for path in (profile_path(model, k, evidence, cache_dir), shipped_profile_path(model, k, evidence)):
        if path.is_file():
            profile = ModelProfile.load(path)
            profile.check_matches(model, k, evidence)
            return profile, path
    return None


def load_profile_for(
    model: str, k: int = 2, evidence: str = "clamped", cache_dir: str | os.PathLike[str] | None = None
) -> ModelProfile | None:
    """The profile of ``model`` for this setup (saved, else shipped; :func:`find_profile_for`), or None."""
    found = find_profile_for(model, k, evidence, cache_dir)
    return found[0] if found is not None else None


def _grid(values: Sequence[float]) -> list[float] | None:
    """The GRID-point quantile grid of the finite ``values`` (None when there is none)."""
    import numpy as np

    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return None
    grid = np.maximum.accumulate(np.quantile(arr, np.linspace(0.0, 1.0, GRID)))  # sorted despite rounding
    return [float(x) for x in grid]


def build_profile(generations: Sequence[Generation], source: str, guard: GuardModel | None = None) -> ModelProfile:
    """A profile from already scored generations (all from one model and setup); with a fitted
    ``guard``, ``guard_score`` and ``reliability_debiased`` get their quantile grids too."""
    if not generations:
        msg = "cannot build a profile from zero generations; give at least one prompt"
        raise ConfigurationError(msg)
    first = generations[0]
    tokens = [t for g in generations for t in g.tokens]
    if not tokens:
        msg = "every calibration answer is empty; raise max_new_tokens or check the prompts"
        raise ConfigurationError(msg)
    token_au, token_eu = _grid([t.au for t in tokens]), _grid([t.eu for t in tokens])
    if token_au is None or token_eu is None:
        msg = "no calibration token has a finite AU and EU (NaN token scores); use evidence='clamped' or other prompts"
        raise ConfigurationError(msg)
    quadrants = QuadrantThresholds.from_quantile([t.au for t in tokens], [t.eu for t in tokens], 0.5, "calibration median")
    rows = [with_guard_score(ResponseStats.from_generation(g, quadrants), guard, g) for g in generations]
    grids = {name: _grid([r.get(name) for r in rows]) for name in STAT_NAMES}
    return ModelProfile(
        model=first.model,
        k=first.k,
        evidence=first.evidence,
        top_n=first.top_n,
        created_at=datetime.now(timezone.utc).isoformat(),
        n_prompts=len(generations),
        n_tokens=len(tokens),
        source=source,
        token_au=token_au,
        token_eu=token_eu,
        stats={name: grid for name, grid in grids.items() if grid is not None},  # a stat never defined is left out
        guard=guard,
    )


def calibrate(
    backend: Backend,
    prompts: Sequence[str],
    options: DecodingOptions | None = None,
    batch_size: int = 8,
    source: str = "user prompts",
    on_batch: Callable[[int], None] | None = None,
    guard: GuardModel | None = None,
) -> ModelProfile:
    """Run ``backend`` over ``prompts`` (in batches) and build its profile.

    ``on_batch(n)`` is called after each batch with the number of prompts it held.
    """
    if not prompts:
        msg = "calibration needs at least one prompt"
        raise ConfigurationError(msg)
    from logtoku_guard.calibration.prompts import answer_in_batches

    generations = answer_in_batches(backend, prompts, options or DecodingOptions(max_new_tokens=64), batch_size, on_batch)
    return build_profile(generations, source, guard)
