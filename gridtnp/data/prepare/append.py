"""``gridtnp data prepare NEW.nc --out STORE.zarr --append``: extend a prepared store with later time steps.

The new inputs are opened, normalised and cut like a prepare's (same variables, under the names the store has),
their steps after the store's last one appended along time, chunked as the store is. The statistics (and the
climatology) are kept, as the training period they describe is unchanged, or recomputed from the extended store
with ``recompute_stats`` (over ``train_start``/``train_end``, default the recorded period). A killed append resumes
when rerun with the same arguments (the checkpoint of ``gridtnp.data.prepare.writer`` inside the store).

* ``append(inputs, store, ...)``: do it, return the store's path.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gridtnp.data.archive import parse_region
from gridtnp.data.climatology import CLIMATOLOGY_ATTR, write_climatology
from gridtnp.data.layout import PROVENANCE_ATTR, STATS_ATTR, DataError, iso, select_time
from gridtnp.data.prepare.input_checks import check_jobs, warn_time_gaps
from gridtnp.data.prepare.inputs import Selection, axis_summary, open_sources
from gridtnp.data.prepare.output_store import as_written, finish_store, is_prepared_store, stats_attr
from gridtnp.data.prepare.writer import STATE, clear_state, save_state, state_matches, write_blocks


def append(
    inputs: Sequence[str | os.PathLike[str]],
    store: str | os.PathLike[str],
    recompute_stats: bool = False,
    train_start: str | None = None,
    train_end: str | None = None,
    storage_options: dict[str, Any] | None = None,
    jobs: int | None = None,
    progress: bool = True,
    checkpoint_s: float = 30.0,
    block_steps: int | None = None,
    end: str | None = None,
    region: str | Sequence[float] | None = None,
    levels: Sequence[float] | None = None,
    coarsen: int | None = None,
) -> Path:
    """Append the steps of ``inputs`` after ``store``'s last one, up to ``end`` (inclusive; default: the inputs'
    last step, or an archive's last day of final data); statistics kept or, with ``recompute_stats``, recomputed
    over ``[train_start, train_end]`` (default: the recorded training period). The inputs are cut to the store's
    ``region``, ``levels`` and ``coarsen`` factor, as recorded by the prepare that wrote it (or as given)."""
    import zarr

    log = print if progress else (lambda *a, **k: None)
    check_jobs(jobs)
    path = Path(store)
    if not is_prepared_store(path):
        raise DataError(f"--append --out {path}: not a store gridtnp data prepare wrote; prepare it first.")
    old = xr.open_zarr(path)
    names = [str(v) for v in old.data_vars]
    steps = int(old[names[0]].encoding["chunks"][0])
    state_path = path / STATE
    resuming = state_path.exists()
    # Resuming: the arrays already grew; the steps before the append are those the checkpoint recorded.
    length = int(json.loads(state_path.read_text())["fingerprint"]["offset"]) if resuming else old.sizes["time"]
    last = old.indexes["time"][length - 1]

    recorded = dict(old.attrs.get(PROVENANCE_ATTR, {}).get("selection") or {})
    box = parse_region(region) if region is not None else _recorded_region(recorded)
    if levels is None:
        levels = recorded.get("levels") or (list(old["level"].values) if "level" in old.dims else None)
    coarsen = coarsen if coarsen is not None else int(recorded.get("coarsen", 1))
    selection = Selection(None, end, box, levels, storage_options, after=np.datetime64(last))
    source = open_sources(inputs, names, steps, selection)
    try:
        new = as_written(source, coarsen)
        warn_time_gaps(new.indexes["time"], f"{path} and {len(inputs)} input(s) appended", after=last)
        for dim in ("latitude", "longitude"):
            if not np.array_equal(new[dim].values, old[dim].values):
                raise DataError(
                    f"{', '.join(map(str, inputs))}: the {dim} axis ({axis_summary(new[dim].values)}) differs from "
                    f"the store's ({axis_summary(old[dim].values)}); expected the same grid. Pass the --region and "
                    "--coarsen the store was prepared with."
                )
        new = new[names].chunk({d: (steps if d == "time" else -1) for d in new.dims})
        new.attrs = dict(old.attrs)  # xarray's append rewrites the root attributes with these
        fingerprint = {
            "append": [str(p) for p in inputs],
            "offset": length,
            "time": [iso(new.time.values[0]), iso(new.time.values[-1])],
            "steps": steps,
            "block": block_steps,
        }
        if not (resuming and state_matches(path, fingerprint)):
            if resuming:
                raise DataError(
                    f"{path} holds an unfinished append of other inputs ({state_path}); rerun that append to finish "
                    "it first."
                )
            log(f"gridtnp data prepare: appending {new.sizes['time']} steps from {iso(new.time.values[0])} to {path}")
            save_state(path, fingerprint, 0, {}, None)  # before the arrays grow: a kill from here on resumes
            with warnings.catch_warnings():  # zarr lists the checkpoint file among the store's members
                warnings.filterwarnings("ignore", message=f"Object at {re.escape(STATE)} is not recognized")
                new.to_zarr(path, append_dim="time", compute=False, consolidated=False, safe_chunks=False)
        write_blocks(
            new, path, (0, 0), fingerprint, steps, False, jobs, checkpoint_s, log, block=block_steps, offset=length
        )
        clear_state(path)
    finally:
        source.close()

    group = zarr.open_group(str(path), mode="r+")
    attrs = dict(group.attrs)
    stats, provenance = dict(attrs[STATS_ATTR]), dict(attrs[PROVENANCE_ATTR])
    provenance.setdefault("appended", []).append(
        {
            "sources": [str(p) for p in inputs],
            "end": iso(new.time.values[-1]),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
    )
    extra: dict[str, Any] = {}
    if recompute_stats:
        stats, extra = _recompute(path, stats, attrs, train_start, train_end, jobs, log)
    finish_store(path, stats, provenance, extra)
    log(f"gridtnp data prepare: {path} now covers {iso(xr.open_zarr(path).time.values[-1])}")
    return path


def _recorded_region(recorded: dict[str, Any]) -> tuple[float, float, float, float] | None:
    box = recorded.get("region")
    return None if box is None else parse_region(box)


def _recompute(
    path: Path,
    recorded: dict[str, Any],
    attrs: dict[str, Any],
    train_start: str | None,
    train_end: str | None,
    jobs: int | None,
    log: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The statistics (and the climatology, if the store has one) over the training period, from the store."""

    first = next(iter(recorded.values()))
    start = train_start or first.get("train_start")
    end = train_end or first.get("train_end")
    ds = xr.open_zarr(path, consolidated=False)  # the consolidated metadata is updated once this is done
    train = select_time(ds, start, end)
    first_index = int(ds.indexes["time"].get_loc(train.indexes["time"][0]))
    span = (first_index, first_index + train.sizes["time"])
    steps = int(ds[next(iter(ds.data_vars))].encoding["chunks"][0])
    climatology = CLIMATOLOGY_ATTR in attrs
    period = f"{iso(train.time.values[0])} to {iso(train.time.values[-1])}"
    log(f"gridtnp data prepare: recomputing the statistics over {period}")
    stats, clim = write_blocks(ds, path, span, {}, steps, climatology, jobs, float("inf"), log, write=False)
    extra = {CLIMATOLOGY_ATTR: write_climatology(path, clim, train)} if clim is not None else {}
    return stats_attr(stats, train, [str(path)]), extra
