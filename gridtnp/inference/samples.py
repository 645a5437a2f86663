"""Joint samples in prediction files, and the raw per-task outputs of a DataModule without a conversion.

A predictive's samples (``predict_step``'s ``samples [B, Nt, Dy, S]``, or ``predict(..., samples=S)``) are written
beside the mean as ``<variable>_sample`` on the mean's dimensions plus a trailing ``sample`` dimension, whose
coordinate (``0 .. S-1``) has the CF ``standard_name: realization``. Each sample goes through the same conversion
as the mean (physical units, climatology added back), so a sample is a field a user can average or threshold as
it is: joint over all targets of a task for a joint likelihood (``lowrank_gaussian``), independent per target
otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import xarray as xr

from gridtnp.inference.cf import CONVENTIONS

Outputs = Sequence[dict[str, torch.Tensor]]


def predicted_variables(ds: xr.Dataset) -> list[str]:
    """The predictive means of ``ds``: the variables with a ``<name>_std`` beside them (``mean`` with ``std``)."""
    return [str(v) for v in ds.data_vars if f"{v}_std" in ds.data_vars or (v == "mean" and "std" in ds.data_vars)]


def attach_samples(ds: xr.Dataset, draws: Sequence[xr.Dataset]) -> xr.Dataset:
    """``ds`` with ``<variable>_sample`` for each predicted variable, stacked from ``draws`` (each a dataset like
    ``ds`` whose means are one sample) along a trailing ``sample`` dimension."""
    if not draws:
        return ds
    for name in predicted_variables(ds):
        stacked = xr.concat([d[name] for d in draws], dim="sample", coords="minimal", compat="override")
        attrs = {k: v for k, v in ds[name].attrs.items() if k in ("units", "standard_name")}
        attrs["long_name"] = f"joint sample of the predictive of {ds[name].attrs.get('long_name', name)}"
        ds[f"{name}_sample"] = stacked.transpose(*ds[name].dims, "sample").astype(np.float32).assign_attrs(attrs)
    ds = ds.assign_coords(sample=("sample", np.arange(len(draws)), {"standard_name": "realization"}))
    ds["sample"].attrs["long_name"] = "sample of the predictive"
    return ds


def with_samples(to_dataset: Callable[[Outputs], xr.Dataset], outputs: Outputs) -> xr.Dataset:
    """``to_dataset(outputs)`` (the outputs' conversion) with ``<variable>_sample`` when the outputs hold
    ``samples [B, Nt, Dy, S]``: each sample converted as the mean is."""
    plain = [{k: v for k, v in o.items() if k != "samples"} for o in outputs]
    ds = to_dataset(plain)
    if not outputs or "samples" not in outputs[0]:
        return ds
    count = outputs[0]["samples"].shape[-1]
    draws = [
        to_dataset([{**p, "mean": o["samples"][..., s]} for p, o in zip(plain, outputs, strict=True)])
        for s in range(count)
    ]
    return attach_samples(ds, draws)


def raw_predictions(outputs: Outputs) -> xr.Dataset:
    """Outputs of a DataModule without ``predictions_to_xarray``: ``mean``, ``std``, ``x`` on ``(task, point, ...)``
    with padded points masked (NaN)."""
    width = max(o["mean"].shape[1] for o in outputs)

    def stack(key: str) -> np.ndarray:
        parts = [
            torch.nn.functional.pad(o[key].float(), (0, 0, 0, width - o[key].shape[1]), value=float("nan"))
            for o in outputs
        ]
        return torch.cat(parts).numpy()

    mask = torch.cat([torch.nn.functional.pad(o["mask"], (0, width - o["mask"].shape[1])) for o in outputs]).numpy()
    mean, std, x = (np.where(mask[..., None], stack(k), np.nan) for k in ("mean", "std", "x"))
    return xr.Dataset(
        {
            "mean": (("task", "point", "output"), mean, {"long_name": "predictive mean (normalised units)"}),
            "std": (("task", "point", "output"), std, {"long_name": "predictive standard deviation (normalised)"}),
            "x": (("task", "point", "input"), x, {"long_name": "target location"}),
        },
        attrs={"Conventions": CONVENTIONS, "source": "gridtnp predictions"},
    )


__all__ = ["attach_samples", "predicted_variables", "raw_predictions", "with_samples"]
