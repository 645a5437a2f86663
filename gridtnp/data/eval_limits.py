"""Evaluation limits in global batches: the trainer's ``limit_val_batches`` / ``limit_test_batches`` /
``limit_predict_batches`` keep the first batches of the whole fixed set, the same batches at any world size, which the
ranks then share (Lightning would apply the limit to each rank's shard, a different subset per world size).

* ``limit_globally(dataset, trainer, taken)``: the dataset cut to the limit of the trainer's current stage.

An integer limit ``k`` keeps batches ``0 .. k-1``; a fraction ``f`` keeps the first ``int(f x batches)`` and is taken
over from the trainer (which is set to ``1.0``, so that Lightning does not cut each rank's shard again).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset, Subset

from gridtnp.registry import ConfigError


def stage_prefix(trainer: Any) -> str | None:
    """``"val"``, ``"test"`` or ``"predict"``: whose ``limit_<prefix>_batches`` applies now (None: no trainer)."""
    if trainer is None:
        return None
    if getattr(trainer, "testing", False):
        return "test"
    return "predict" if getattr(trainer, "predicting", False) else "val"


def limit_globally(dataset: Dataset, trainer: Any, taken: dict[str, float]) -> Dataset:
    """``dataset`` cut to the first batches the trainer's limit keeps, counted over all ranks (``taken``: the
    fractional limits already taken over from this trainer, by stage, updated in place)."""
    prefix = stage_prefix(trainer)
    name = f"limit_{prefix}_batches"
    limit = getattr(trainer, name, None) if prefix else None
    if isinstance(limit, float) and 0.0 < limit < 1.0:
        taken[prefix] = limit
        setattr(trainer, name, 1.0)
    elif limit == 1.0 and prefix in taken:
        limit = taken[prefix]
    length = len(dataset)
    whole = isinstance(limit, float) and limit == 1.0
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or whole or limit == 0 or length == 0:
        return dataset  # no limit (0: Lightning skips the stage)
    keep = min(length, limit) if isinstance(limit, int) else int(length * limit)
    if keep < 1:
        raise ConfigError(
            f"{name} {limit} keeps none of the {length} batches of the {prefix} set; raise it to at least "
            f"{1 / length:.3g} (or give a number of batches)."
        )
    return dataset if keep == length else Subset(dataset, range(keep))
