"""``gridtnp``: the console entry point and its subcommands.

``fit | validate | test | predict`` (``gridtnp.cli.lightning``), ``list`` for the registry, ``data prepare``
(``gridtnp.data.prepare``), ``plot`` and ``report`` (``gridtnp.cli.evaluate``), ``place`` (``gridtnp.cli.place``).

gridtnp fit --config recipes/gp1d_tnp.yaml --trainer.max_steps 300
gridtnp plot --config recipes/gp1d_tnp.yaml --ckpt_path runs/.../last.ckpt --out plots/
gridtnp report --config recipes/era5_swin.yaml --ckpt_path runs/.../last.ckpt --out report.html
gridtnp place --ckpt_path runs/.../last.ckpt --candidates grid --count 5 --out placement/
gridtnp list processor
gridtnp list processor swin
gridtnp list model --params
gridtnp list --docs docs/components.md --check
gridtnp data prepare era5.nc --out era5.zarr --train-start 2019-03-01 --train-end 2019-03-21
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import warnings
from typing import Any

from gridtnp.registry import KINDS, ConfigError, available, describe, document

# torch and Lightning load with the subcommands that use them (gridtnp.cli.lightning, .evaluate, .guards), so
# `gridtnp --help` and `gridtnp data prepare` start in about a second.
__all__ = ["main"]


def list_components(args: list[str]) -> None:
    """``gridtnp list [KIND [NAME]] [--params]``: the registry, one component a line, or one component in full."""
    parser = argparse.ArgumentParser(
        prog="gridtnp list",
        description="List registered components; with KIND and NAME, show one component's description and arguments.",
    )
    parser.add_argument("kind", nargs="?", choices=list(KINDS), help="only this kind")
    parser.add_argument("name", nargs="?", help="one component of KIND: its docstring and arguments")
    parser.add_argument("--params", action="store_true", help="build each model preset and count its parameters")
    parser.add_argument("--markdown", metavar="TABLE", help="print a markdown table: components or shared")
    parser.add_argument("--docs", nargs="+", metavar="PAGE", help="rewrite the marked tables of PAGEs")
    parser.add_argument("--check", action="store_true", help="with --docs: change nothing, exit 1 if a page is stale")
    opts = parser.parse_args(args)
    if opts.markdown or opts.docs:
        from gridtnp.cli.doc_tables import render, update_pages

        if opts.markdown:
            print(render(opts.markdown))
            return
        stale = update_pages(opts.docs, check=opts.check)
        for page in stale:
            print(f"{page}: {'stale; run gridtnp list --docs ' + page if opts.check else 'updated'}")
        if stale and opts.check:
            raise SystemExit(1)
        return
    if opts.name is not None:
        print(document(opts.kind, opts.name))
        return
    kinds = [opts.kind] if opts.kind else list(KINDS)
    for kind in kinds:
        print(f"{kind}: {KINDS[kind]}")
        for name in available(kind):
            extra = ""
            if opts.params and kind == "model":
                from gridtnp.models import count_parameters, create_model

                extra = f"  [{count_parameters(create_model(name)):,} parameters]"
            print(f"  {name:<24} {describe(kind, name)}{extra}")
    if opts.kind:
        print(f"\n`gridtnp list {opts.kind} NAME` shows one {opts.kind}'s arguments.")


SUBCOMMANDS = {
    "fit": "train a model from a recipe (resumes from checkpoints in --checkpoint.dirpath)",
    "validate": "evaluate a checkpoint on the validation set",
    "test": "evaluate a checkpoint on the test set: metric table and <checkpoint>.test_metrics.json",
    "predict": "write a checkpoint's predictions as NetCDF or Zarr (--predictions.path)",
    "list": "the registry: gridtnp list [KIND [NAME]] [--params]",
    "plot": "PNG plots of a checkpoint's predictions: gridtnp plot --config R --ckpt_path C --out DIR",
    "report": "one HTML page of a checkpoint's evaluation: gridtnp report --config R --ckpt_path C --out F.html",
    "place": "new station sites by predictive-variance drop: gridtnp place --ckpt_path C --count K --out DIR",
    "data": "gridtnp data prepare: NetCDF / GRIB -> a Zarr store for the ERA5 DataModules",
}


def usage() -> str:
    """``gridtnp --help``: every subcommand with one line each."""
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: gridtnp SUBCOMMAND [options]   (gridtnp SUBCOMMAND --help for its options)", "", "subcommands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in SUBCOMMANDS.items()]
    lines += ["", "  --version  print the version and exit", "  --verbose  keep third-party warnings gridtnp filters"]
    return "\n".join(lines)


def show_own_warnings_as_lines() -> None:
    """Print the warnings gridtnp's own code raises as one line each, ``gridtnp: warning: ...``, without the file
    name and source line Python adds (they point into gridtnp, not at what the user should change)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    default = warnings.showwarning
    if getattr(default, "gridtnp_lines", False):
        return

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if os.path.abspath(filename).startswith(package) and issubclass(category, UserWarning):
            print(f"gridtnp: warning: {message}", file=file or sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    show.gridtnp_lines = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gridtnp`` console script."""
    import gridtnp

    args = sys.argv[1:] if argv is None else list(argv)
    show_own_warnings_as_lines()
    if "--verbose" in args:
        args.remove("--verbose")
    elif args and args[0] not in ("data", "-h", "--help", "--version"):
        from gridtnp.cli.reports import quiet_third_party

        quiet_third_party(args[0])
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return
    if args[0] == "--version":
        print(f"gridtnp {gridtnp.__version__}")
        return
    try:
        if args[0] not in SUBCOMMANDS and not args[0].startswith("-"):
            close = difflib.get_close_matches(args[0], SUBCOMMANDS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown subcommand {args[0]!r}.{hint} Subcommands: {', '.join(SUBCOMMANDS)}.")
        if args[0] == "list":
            list_components(args[1:])
        elif args and args[0] == "plot":
            from gridtnp.cli.evaluate import plot_main

            plot_main(args[1:])
        elif args and args[0] == "report":
            from gridtnp.cli.evaluate import report_main

            report_main(args[1:])
        elif args and args[0] == "place":
            from gridtnp.cli.place import place_main

            place_main(args[1:])
        elif args and args[0] == "data":
            from gridtnp.data.prepare import data_main  # xarray and dask only load for this subcommand

            data_main(args[1:])
        else:
            from gridtnp.cli.lightning import run_lightning

            if argv is None:  # LightningCLI reads sys.argv itself (and warns if given both)
                sys.argv = [sys.argv[0], *args]
            run_lightning(None if argv is None else args)
    except argparse.ArgumentError as err:
        from gridtnp.cli.guards import argument_error_line

        print(f"gridtnp: error: {argument_error_line(err, args)}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as err:
        from gridtnp.cli.guards import environment_error_line, find_config_error

        # jsonargparse re-raises errors from a model's __init__ wrapped in its own ValueError:
        # report the ConfigError underneath (it says what to fix) instead of a traceback.
        config_error = find_config_error(err)
        line = str(config_error) if config_error is not None else environment_error_line(err)
        if line is None:
            raise
        print(f"gridtnp: error: {line}", file=sys.stderr)
        raise SystemExit(2) from None
