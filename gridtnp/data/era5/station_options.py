"""The ``task:`` and ``predict:`` sections of ``StationReanalysisDataModule``: ``StationTaskConfig`` (with its
``coverage_dropout:`` part, ``CoverageDropout``), ``StationPredictConfig``, each a frozen dataclass that checks itself
(errors name ``task.<key>``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gridtnp.data.era5.forecast_hours import check_forecast_hours, is_forecast
from gridtnp.data.sections import LoaderConfig, check_count, fraction_range, section
from gridtnp.registry import ConfigError

#: The sides of the box a coarse grid can be trimmed at, in the order of ``StationTaskConfig.trim_sides``.
SIDES = ("north", "south", "west", "east")


def check_offset(name: str, value: Sequence[int], factors: Sequence[int]) -> tuple[int, int]:
    """``(lat, lon)`` block offsets as ints, or a ConfigError unless ``0 <= offset < factor`` for every factor."""
    smallest = min(factors)
    if isinstance(value, str) or len(value) != 2 or not all(isinstance(o, int) and 0 <= o < smallest for o in value):
        allowed = "'random' or " if name.endswith("coarsen_offset") else ""
        raise ConfigError(
            f"{name} must be {allowed}[lat, lon] integers in 0..{smallest - 1} (fine cells before the first "
            f"block edge, below the block size {smallest}); got {value!r}."
        )
    return int(value[0]), int(value[1])


def check_probability(key: str, value: object) -> float:
    """``value`` as a float, or a ConfigError naming ``key`` unless ``0 <= value <= 1``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{key} must be a probability in [0, 1]; got {value!r}.")
    return float(value)


@dataclass(frozen=True)
class CoverageDropout:
    """Parts of a training task's coarse grid left out (``task.coverage_dropout:``), so that a model has seen grids
    that do not cover its whole box; the missing blocks are masked out of the ``"grid"`` context, never filled.

    Args:
        trim_prob: each side of the box (north, south, west, east) of a task loses its outermost block rows (or
            columns) with this probability, as ``coarsen(..., boundary="trim")`` drops partial edge blocks.
        max_trim: a trimmed side loses ``1..max_trim`` block rows or columns (uniform).
        block_prob: a task loses scattered blocks (NaN coarse cells) with this probability ...
        block_fraction: ... each of its blocks then missing with this probability.
        patch_prob: a task loses a masked region with this probability: a rectangle of blocks ...
        max_patch: ... ``1..max_patch`` blocks high and wide (uniform each), anywhere in the grid.
    """

    trim_prob: float = 0.0
    max_trim: int = 1
    block_prob: float = 0.0
    block_fraction: float = 0.1
    patch_prob: float = 0.0
    max_patch: int = 3

    def __post_init__(self) -> None:
        for key in ("trim_prob", "block_prob", "block_fraction", "patch_prob"):
            object.__setattr__(self, key, check_probability(f"task.coverage_dropout.{key}", getattr(self, key)))
        check_count("task.coverage_dropout.max_trim", self.max_trim, 1)
        check_count("task.coverage_dropout.max_patch", self.max_patch, 1)


def check_trim(value: object) -> dict[str, int]:
    """``task.eval_trim`` as ``{side: block rows or columns}``, or a ConfigError naming the side or value."""
    if not isinstance(value, dict):
        raise ConfigError(f"task.eval_trim must be a mapping of sides {list(SIDES)} to counts, e.g. "
                          f"{{south: 1, east: 1}}; got {value!r}.")  # fmt: skip
    for side, count in value.items():
        if side not in SIDES:
            raise ConfigError(f"task.eval_trim has no side {side!r}; its sides: {', '.join(SIDES)}.")
        check_count(f"task.eval_trim.{side}", count, 0)
    return {side: int(value[side]) for side in SIDES if side in value}


@dataclass(frozen=True)
class StationTaskConfig:
    """What a station + reanalysis task holds (``task:``).

    Args:
        station_variable: the variable observed at the stations (context and targets).
        grid_variables: the variables of the on-the-grid context; an empty list drops the ``"grid"`` source (the
            paper's t2m-only ablation: stations alone).
        coarsen: block size of the on-the-grid context in fine cells (4: 0.25 -> 1 degree; 1 keeps the store's
            resolution), or a list of sizes, one drawn per training task.
        coarsen_offset: where training tasks' blocks start, in fine cells from the store's first row / column:
            ``random`` (uniform in ``0..c-1`` per dimension and task) or a fixed ``[lat, lon]`` pair.
        eval_coarsen: block size for validation, test and predictions; null: ``coarsen`` (its first entry if a list).
        eval_offset: ``[lat, lon]`` offset of the first block edge for validation, test and predictions.
        eval_trim: block rows / columns left out at the box's sides in validation, test and predictions, e.g.
            ``{south: 1, east: 1}`` (with ``eval_offset: [1, 0]``, the grid ``coarsen(..., boundary="trim")`` gives
            on the sample's box); null: the whole box covered.
        coverage_dropout: training tasks with parts of the coarse grid missing (trimmed sides, scattered blocks, a
            masked region; ``CoverageDropout``), masked out of the context; null: every block of every task.
        context_fraction: ``(a, b)``: each task uses a share ``~ U[a, b]`` of the stations as context (the paper's
            U[0, 0.3]).
        targets: ``"all"`` (every station, context ones included) or ``"held_out"`` (stations not in the context).
        time_offset_hours: the grid context is from this many hours before the target hour (nowcasting).
        eval_draws: tasks per hour in validation and test (each a different context draw, fixed by the seed).
        eval_stride: validation and test take every ``eval_stride``-th hour of their dates (1: every hour).
        time_features: append (sin, cos) of the target hour's hour of day (UTC) to every grid block's values
            (``dim_y["grid"]`` grows by 2): the diurnal cycle shapes sub-grid detail (land, sea, hills).
        climatology: give every value as its departure from the climatology of its grid point and UTC hour of day
            (the mean over the training dates' hours at that hour, computed from the store at ``setup`` unless
            stored), scaled by the variable's std; ``gridtnp predict`` and the checkpoint add it back.
        unique_grid_points: keep one station per grid point (the first in the file): two stations on one grid point
            have the same value, so one in the context would give the other away as a target.
        random_points: off-the-grid values at this many distinct, uniformly random grid points of the store, drawn
            anew for every task, in place of the stations (the {On, Off}-the-grid thesis's ERA5 task); null: the
            stations.
        num_targets: a fixed number of targets per task: that many held-out points after the context in each
            task's random order; null: ``targets`` decides.
        context_hours: ``[a, b]`` (``a <= b <= 0``): forecast tasks from an initial hour ``t``: the context stations
            at every hour ``t + a .. t + b``, each point at ``x = (hours from t, lat, lon)`` (``dim_x`` 3; the grid at
            ``-time_offset_hours``); null: ``[0, 0]`` when ``lead_hours`` is set.
        lead_hours: forecast targets: the stations at ``t + h`` for each ``h`` (increasing hours >= 0), at ``x = (h,
            lat, lon)``; null: ``[0]`` when ``context_hours`` is set. Both null: the same-hour task, ``x = (lat, lon)``.
    """

    station_variable: str = "t2m"
    grid_variables: tuple[str, ...] = ("t2m",)
    coarsen: int | tuple[int, ...] = 4
    coarsen_offset: Literal["random"] | tuple[int, int] = "random"
    eval_coarsen: int | None = None
    eval_offset: tuple[int, int] = (0, 0)
    eval_trim: dict[str, int] | None = None
    coverage_dropout: CoverageDropout | None = None
    context_fraction: tuple[float, float] = (0.0, 0.3)
    targets: Literal["all", "held_out"] = "all"
    time_offset_hours: int = 0
    eval_draws: int = 1
    eval_stride: int = 1
    time_features: bool = False
    climatology: bool = False
    unique_grid_points: bool = True
    random_points: int | None = None
    num_targets: int | None = None
    context_hours: tuple[int, int] | None = None
    lead_hours: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_forecast_hours(self)
        if self.forecast and self.num_targets is not None:
            raise ConfigError("task.num_targets is for same-hour tasks; forecast tasks (task.lead_hours) target every "
                              "station at each lead hour: leave num_targets null.")  # fmt: skip
        check_count("task.time_offset_hours", self.time_offset_hours, 0)
        check_count("task.eval_draws", self.eval_draws, 1)
        check_count("task.eval_stride", self.eval_stride, 1)
        if self.targets not in ("held_out", "all"):
            raise ConfigError(f"task.targets must be 'all' or 'held_out'; got {self.targets!r}.")
        if isinstance(self.grid_variables, str):
            raise ConfigError(f"task.grid_variables must be a list of names; got {self.grid_variables!r}.")
        object.__setattr__(self, "grid_variables", tuple(self.grid_variables))
        if not self.grid_variables and self.time_features:
            raise ConfigError("task.time_features needs task.grid_variables (the clock rides on the grid context).")
        for i, factor in enumerate(self.factors):
            check_count(f"task.coarsen[{i}]", factor, 1)
        if not self.factors:
            check_count("task.coarsen", None, 1)
        check_count("task.eval_coarsen", self.eval_factor, 1)
        if self.coarsen_offset != "random":
            object.__setattr__(
                self, "coarsen_offset", check_offset("task.coarsen_offset", self.coarsen_offset, self.factors)
            )
        object.__setattr__(self, "eval_offset", check_offset("task.eval_offset", self.eval_offset, [self.eval_factor]))
        if self.eval_trim is not None:
            object.__setattr__(self, "eval_trim", check_trim(self.eval_trim))
        if self.coverage_dropout is not None:
            dropout = section(CoverageDropout, self.coverage_dropout, "task.coverage_dropout")
            object.__setattr__(self, "coverage_dropout", dropout)
        object.__setattr__(self, "context_fraction", fraction_range("task.context_fraction", self.context_fraction))
        for key, smallest in (("random_points", 2), ("num_targets", 1)):
            if getattr(self, key) is not None:
                check_count(f"task.{key}", getattr(self, key), smallest)

    @property
    def forecast(self) -> bool:
        """Forecast tasks (``context_hours`` or ``lead_hours`` set): inputs ``x = (hours from t, lat, lon)``."""
        return is_forecast(self)

    @property
    def factors(self) -> list[int]:
        """The training block sizes to draw from."""
        return [self.coarsen] if isinstance(self.coarsen, int) else list(self.coarsen)

    @property
    def trim_sides(self) -> tuple[int, int, int, int] | None:
        """``eval_trim`` as block rows / columns left out at ``(north, south, west, east)``; None: no trim."""
        if not self.eval_trim or not any(self.eval_trim.values()):
            return None
        return tuple(self.eval_trim.get(side, 0) for side in SIDES)  # type: ignore[return-value]

    @property
    def eval_factor(self) -> int:
        """The block size of validation, test and predictions."""
        return self.factors[0] if self.eval_coarsen is None and self.factors else self.eval_coarsen  # type: ignore[return-value]


@dataclass(frozen=True)
class StationPredictConfig:
    """What ``gridtnp predict`` covers (``predict:``).

    Args:
        split: the split whose hours are predicted, every hour in order.
        context_fraction: the stations' context share (default: the middle of ``task.context_fraction``), drawn
            with a fixed seed.
        resolution: predict on a regular lat/lon grid of this spacing (degrees) over the store's box instead of at
            the stations.
    """

    split: Literal["train", "val", "test"] = "test"
    context_fraction: float | None = None
    resolution: float | None = None

    def __post_init__(self) -> None:
        if self.split not in ("train", "val", "test"):
            raise ConfigError(f"predict.split must be 'train', 'val' or 'test'; got {self.split!r}.")
        if self.context_fraction is not None and not 0.0 <= float(self.context_fraction) <= 1.0:
            raise ConfigError(f"predict.context_fraction must be in [0, 1]; got {self.context_fraction!r}.")
        if self.resolution is not None and not float(self.resolution) > 0.0:
            raise ConfigError(f"predict.resolution must be a spacing in degrees > 0; got {self.resolution!r}.")


#: The defaults of ``StationReanalysisDataModule``'s sections (frozen, so one instance serves every module).
DEFAULT_STATION_TASK = StationTaskConfig()
DEFAULT_PREDICT = StationPredictConfig()
#: 16 tasks a batch, 100 training batches an epoch; validation and test cover their dates (no batch counts).
STATION_LOADER = LoaderConfig(batch_size=16, train_batches=100, val_batches=1, test_batches=1)
