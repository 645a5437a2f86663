"""The running statistics of ``gridtnp data prepare``'s writer, folded in block by block and saved with its
checkpoints: ``RunningMoments`` (count, mean and sum of squared deviations of the finite values, per level, merged
as Chan et al.) and ``HourlySums`` (float64 sums per grid point and UTC hour of day, for the climatology)."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

MOMENT_ELEMENTS = 2**22  # values per float64 pass of the running statistics (32 MiB)
FILL_LIMIT = 1e30  # beyond any physical value: an undeclared fill value (netCDF's default float fill is 9.97e36)


def mask_fill_values(values: np.ndarray, count: int = 0) -> tuple[np.ndarray, int]:
    """``values [T, ...]`` with every value beyond ``+-FILL_LIMIT`` (infinities too) set to NaN, and ``count`` plus
    how many were; declared ``_FillValue`` / ``missing_value`` are NaN already (xarray masks them when reading)."""
    if values.dtype.kind != "f" or values.size == 0:
        return values, count
    flat = values.reshape(-1)
    if np.fmax.reduce(flat) <= FILL_LIMIT and np.fmin.reduce(flat) >= -FILL_LIMIT:  # no temporaries, NaN skipped
        return values, count
    bad = (values > FILL_LIMIT) | (values < -FILL_LIMIT)
    values = values if values.flags.writeable else values.copy()
    values[bad] = np.nan
    return values, count + int(bad.sum())


class HourlySums:
    """Per variable the float64 sums ``[24, ...]`` of the finite values at each UTC hour of day, the training steps
    per hour ``[24]``, and ``missing[v] [24, ...]`` (int32) counts of non-finite values, allocated at the first one
    (a field without gaps needs no per-point counts)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.sums = {v: np.zeros((24, *shape)) for v, shape in shapes.items()}
        self.steps = np.zeros(24, dtype=np.int64)
        self.missing: dict[str, np.ndarray] = {}

    def add(self, v: str, values: np.ndarray, hours: np.ndarray, count_steps: bool, finite: bool | None = None) -> None:
        """Fold in ``values [T, ...]`` (float32) of variable ``v`` at UTC hours ``hours [T]``; ``count_steps`` once
        per block (the steps are shared by the variables); ``finite``: whether every value is known to be finite
        (None: checked here)."""
        if finite is None:
            finite = bool(np.isfinite(values).all())
        if count_steps:
            np.add.at(self.steps, hours, 1)
        if finite:  # a step at a time, added as it is: no copies, no float64 temporaries
            for step, h in zip(values, hours.tolist(), strict=True):
                np.add(self.sums[v][h], step, out=self.sums[v][h])
            return
        for h in np.unique(hours):
            x = values[hours == h]
            ok = np.isfinite(x)
            if v not in self.missing:
                self.missing[v] = np.zeros(self.sums[v].shape, dtype=np.int32)  # up to 245,000 years
            self.sums[v][h] += np.where(ok, x, 0.0).sum(0, dtype=np.float64)
            self.missing[v][h] += (~ok).sum(0, dtype=np.int32)

    def means(self, ds: xr.Dataset) -> xr.Dataset:
        """The hourly means ``[hour, ..., lat, lon]`` (float32, NaN where no finite value) of the hours that had
        training steps, an hour at a time; each variable's sums are released once its means are taken."""
        hours = [h for h in range(24) if self.steps[h] > 0]
        out = {}
        for v in list(self.sums):
            sums, missing = self.sums.pop(v), self.missing.pop(v, None)
            mean = np.empty((len(hours), *sums.shape[1:]), dtype=np.float32)
            for i, h in enumerate(hours):
                if missing is None:
                    mean[i] = sums[h] / self.steps[h]
                else:
                    count = self.steps[h] - missing[h]
                    with np.errstate(invalid="ignore", divide="ignore"):
                        mean[i] = np.where(count > 0, sums[h] / np.maximum(count, 1), np.nan)
            del sums, missing
            out[v] = (("hour", *ds[v].dims[1:]), mean)
        coords = {d: ds[d].values for v in ds.data_vars for d in ds[v].dims[1:]}
        return xr.Dataset(out, coords={"hour": np.asarray(hours, dtype=np.int64), **coords})

    def arrays(self) -> dict[str, np.ndarray]:
        """The state to checkpoint, by name."""
        return (
            {"steps": self.steps}
            | {f"sum/{v}": a for v, a in self.sums.items()}
            | {f"missing/{v}": a for v, a in self.missing.items()}
        )

    def load(self, saved: Any) -> None:
        """Restore the state ``arrays`` gave (an ``np.load`` of it)."""
        self.steps[...] = saved["steps"]
        for v in self.sums:
            self.sums[v][...] = saved[f"sum/{v}"]
            if f"missing/{v}" in saved:
                self.missing[v] = np.array(saved[f"missing/{v}"])


class RunningMoments:
    """Count, mean and sum of squared deviations ``[L]`` (one per level, or one) of the finite values seen."""

    def __init__(self, levels: int) -> None:
        self.n = np.zeros(levels)
        self.mean = np.zeros(levels)
        self.m2 = np.zeros(levels)

    def add(self, values: np.ndarray, level_axis: int | None) -> bool:
        """Fold in ``values [T, (L,) H, W]`` (float32), per level when ``level_axis`` is given, a few time steps
        at a time (float64 copies of a whole block would take several times its memory); whether every value was
        finite."""
        per_step = max(1, int(np.prod(values.shape[1:])))
        step = max(1, MOMENT_ELEMENTS // per_step)
        finite = True
        for t in range(0, values.shape[0], step):
            finite &= self._add(values[t : t + step], level_axis)
        return finite

    def _add(self, values: np.ndarray, level_axis: int | None) -> bool:
        x = values.reshape(1, -1) if level_axis is None else np.moveaxis(values, level_axis, 0)
        x = x.reshape(x.shape[0], -1)
        total = x.sum(1, dtype=np.float64)
        finite = bool(np.isfinite(total).all())  # a float64 sum of float32 values is finite only if every value is
        with np.errstate(invalid="ignore", divide="ignore"):
            if finite:  # the common case: float64 sums without a float64 copy of x or masked copies
                n = np.full(x.shape[0], float(x.shape[1]))
                mean = total / n
                m2 = np.array([squared_deviations(row, mu) for row, mu in zip(x, mean.tolist(), strict=True)])
            else:
                x = x.astype(np.float64)
                ok = np.isfinite(x)
                n = ok.sum(1).astype(np.float64)
                mean = np.where(ok, x, 0.0).sum(1) / n
                m2 = np.where(ok, (x - mean[:, None]) ** 2, 0.0).sum(1)
        ok = n > 0
        total = self.n + n
        delta = np.where(ok, mean - self.mean, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(ok, n / np.where(total > 0, total, 1.0), 0.0)
        self.m2 = self.m2 + np.where(ok, m2, 0.0) + delta**2 * self.n * share
        self.mean = self.mean + delta * share
        self.n = total
        return finite

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mean [L], std [L])``, NaN where no finite value was seen."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n > 0, self.mean, np.nan), np.where(self.n > 0, np.sqrt(self.m2 / self.n), np.nan)

    def state(self) -> dict[str, list[float]]:
        return {"n": self.n.tolist(), "mean": self.mean.tolist(), "m2": self.m2.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, list[float]]) -> RunningMoments:
        out = cls(len(state["n"]))
        out.n, out.mean, out.m2 = (np.asarray(state[k], dtype=np.float64) for k in ("n", "mean", "m2"))
        return out


SQUARES_ELEMENTS = 2**15  # values per float64 pass of the squared deviations (256 KiB: in the core's cache)


def squared_deviations(x: np.ndarray, mean: float) -> float:
    """``sum((x - mean) ** 2)`` of ``x [N]`` (float32) in float64, a cache-sized piece at a time: the same as one
    float64 pass without its float64 copy of ``x`` going through memory."""
    buffer = np.empty(min(len(x), SQUARES_ELEMENTS))
    total = 0.0
    for i in range(0, len(x), SQUARES_ELEMENTS):
        piece = buffer[: min(SQUARES_ELEMENTS, len(x) - i)]
        d = np.subtract(x[i : i + SQUARES_ELEMENTS], mean, out=piece, dtype=np.float64)  # not float32's mean
        total += float(np.einsum("i,i->", d, d))  # not BLAS: its threads would contend with the reading thread
    return total
