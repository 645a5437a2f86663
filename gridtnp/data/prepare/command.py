"""``gridtnp data prepare`` and ``gridtnp data prepare --append``: the command line (``data_main(argv)``) over
``gridtnp.data.prepare.pipeline.prepare`` and ``gridtnp.data.prepare.append.append``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from gridtnp.data.freed_memory import keep_freed_memory
from gridtnp.data.layout import DataError
from gridtnp.data.prepare.pipeline import prepare
from gridtnp.files import out_of_space


def data_main(argv: Sequence[str]) -> None:
    """``gridtnp data prepare ...``: the command line (``gridtnp data prepare --help``)."""
    parser = argparse.ArgumentParser(prog="gridtnp data", description="Prepare data for gridtnp.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser(
        "prepare",
        help="NetCDF / GRIB files -> a Zarr store in gridtnp's layout, with normalisation statistics",
        description="Convert NetCDF / GRIB / Zarr inputs (local, or a Zarr store or NetCDF-4 file at a URL, such as "
        "ARCO-ERA5) into one Zarr store in gridtnp's layout (latitudes ascending, "
        "longitudes in [-180, 180), float32, chunked for random access in time), with each variable's mean and std "
        "over the training period in the store's attributes.",
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="NetCDF (.nc), GRIB (.grib, needs cfgrib) or Zarr (.zarr) inputs, or the URL (gs://, https://) of a "
        "Zarr store (e.g. ARCO-ERA5) or of NetCDF-4 files, read by byte ranges (pip install gridtnp[cloud])",
    )
    p.add_argument("--out", required=True, metavar="STORE.zarr", help="the Zarr store to write")
    p.add_argument(
        "--variables",
        nargs="+",
        metavar="VAR",
        help="variables to keep, by archive or short name (2m_temperature or t2m; u850 for one pressure level; "
        "default: every gridded one)",
    )
    p.add_argument(
        "--start", metavar="DATE", help="first date to keep (default: the inputs' first step; an archive's first day)"
    )
    p.add_argument(
        "--end",
        metavar="DATE",
        help="last date to keep, inclusive (default: the inputs' last step; an archive's last day of final data)",
    )
    p.add_argument(
        "--region",
        nargs=4,
        type=float,
        metavar=("LAT_MIN", "LAT_MAX", "LON_MIN", "LON_MAX"),
        help="keep a lat/lon box in degrees; LON_MIN > LON_MAX crosses the date line (e.g. -50 10 160 -160)",
    )
    p.add_argument("--levels", nargs="+", type=float, metavar="HPA", help="pressure levels to keep of level variables")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option of URL inputs, repeatable (e.g. token=anon for a public bucket)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="concurrent reads (default: dask's threads for Zarr inputs, 1 for local NetCDF/GRIB files)",
    )
    p.add_argument("--coarsen", type=int, metavar="F", help="average F x F blocks of grid points first")
    p.add_argument(
        "--space-chunk",
        type=int,
        default=None,
        metavar="N",
        help="N x N grid points per chunk (default: the whole grid; smaller for stores read by region)",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="a dask.distributed scheduler (tcp://host:8786) whose workers read the inputs (pip install "
        "gridtnp[distributed]; the workers must see the input files)",
    )
    p.add_argument("--train-start", metavar="DATE", help="first date of the statistics period (default: first step)")
    p.add_argument("--train-end", metavar="DATE", help="last date of the statistics period, inclusive (default: last)")
    p.add_argument(
        "--time-chunk",
        type=int,
        default=None,
        metavar="N",
        help="time steps per Zarr chunk (default: as many as keep a chunk under 4 MiB, at most 24)",
    )
    p.add_argument(
        "--climatology",
        action="store_true",
        help="also store each variable's mean per grid point and UTC hour over the training period (read by the "
        "DataModules' climatology option instead of a pass over the training period)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="extend the prepared store at --out with the inputs' later time steps, up to --end, cut to the store's "
        "region, levels and --coarsen as recorded (statistics kept)",
    )
    p.add_argument(
        "--recompute-stats",
        action="store_true",
        help="with --append: recompute the statistics (and climatology) over --train-start/--train-end "
        "(default: the recorded period)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    opts = parser.parse_args(list(argv))
    keep_freed_memory()  # this process is prepare's own: every block's arrays reuse the last block's pages
    try:
        _run(opts)
    except DataError:
        raise
    except Exception as err:
        if not out_of_space(err):
            raise
        raise DataError(
            f"no space left on device writing {opts.out}; free space or choose another --out (rerun the same "
            "command to resume)."
        ) from err


def _run(opts: argparse.Namespace) -> None:
    """Prepare or append as ``opts`` (the parsed command line) asks."""
    if opts.append:
        from gridtnp.data.prepare.append import append

        fixed = {
            "--variables": opts.variables,
            "--start": opts.start,
            "--time-chunk": opts.time_chunk,
            "--space-chunk": opts.space_chunk,
            "--climatology": opts.climatology or None,
            "--overwrite": opts.overwrite or None,
            "--scheduler": opts.scheduler,
        }
        given = [flag for flag, value in fixed.items() if value is not None]
        if given:
            raise DataError(
                f"--append takes the store's variables, chunks and climatology and starts after its last step; "
                f"drop {', '.join(given)} (it may take --end, --region, --levels, --coarsen, --storage-option, "
                "--jobs and --recompute-stats with --train-start/--train-end)."
            )
        append(
            opts.inputs,
            opts.out,
            recompute_stats=opts.recompute_stats,
            train_start=opts.train_start,
            train_end=opts.train_end,
            storage_options=_storage_options(opts.storage_option),
            jobs=opts.jobs,
            progress=not opts.quiet,
            end=opts.end,
            region=opts.region,
            levels=opts.levels,
            coarsen=opts.coarsen,
        )
        return
    if opts.recompute_stats:
        raise DataError("--recompute-stats goes with --append; a new store's statistics are computed anyway.")
    prepare(
        opts.inputs,
        opts.out,
        variables=opts.variables,
        train_start=opts.train_start,
        train_end=opts.train_end,
        time_chunk=opts.time_chunk,
        overwrite=opts.overwrite,
        progress=not opts.quiet,
        climatology=opts.climatology,
        start=opts.start,
        end=opts.end,
        region=opts.region,
        levels=opts.levels,
        storage_options=_storage_options(opts.storage_option),
        jobs=opts.jobs,
        scheduler=opts.scheduler,
        coarsen=opts.coarsen if opts.coarsen is not None else 1,
        space_chunk=opts.space_chunk,
    )


def _storage_options(pairs: Sequence[str]) -> dict[str, Any] | None:
    """``["token=anon"]`` -> ``{"token": "anon"}`` (None when empty)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DataError(f"--storage-option {pair!r}: expected KEY=VALUE, e.g. token=anon.")
        out[key] = value
    return out or None
