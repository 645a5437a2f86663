"""How a run is scaled out: ranks, effective batch size and learning rate, reported once at the start of ``fit``."""

from __future__ import annotations

from typing import Any

import lightning as L


def training_scale(trainer: L.Trainer, lr: float | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """World size, tasks per optimiser step and learning rate of a run set up by ``trainer`` (``batch_size``: the
    DataModule's tasks per batch, its optional ``batch_size`` hook; None: not reported).

    DDP averages gradients over ranks, so one optimiser step sees ``batch_size x world_size x accumulate_grad_batches``
    tasks at the configured learning rate (gridtnp does not rescale it with the batch size).
    """
    accumulate = int(trainer.accumulate_grad_batches)
    scale: dict[str, Any] = {
        "world_size": int(trainer.world_size),
        "num_nodes": int(trainer.num_nodes),
        "devices_per_node": int(trainer.num_devices),
        "accumulate_grad_batches": accumulate,
        "precision": str(trainer.precision),
    }
    if batch_size is not None:
        scale["batch_size_per_rank"] = int(batch_size)
        scale["effective_batch_size"] = int(batch_size) * scale["world_size"] * accumulate
    if lr is not None:
        scale["lr"] = float(lr)
    return scale


def report_training_scale(trainer: L.Trainer, lr: float | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """Print the scale on global rank 0 and add it to every logger's hyperparameters; returns it."""
    scale = training_scale(trainer, lr, batch_size)
    if trainer.is_global_zero:
        tasks = (
            f"effective batch size {scale['effective_batch_size']} tasks per step "
            f"= {scale['batch_size_per_rank']} per rank x {scale['world_size']} ranks "
            f"x {scale['accumulate_grad_batches']} accumulated"
            if "effective_batch_size" in scale
            else f"{scale['world_size']} ranks x {scale['accumulate_grad_batches']} accumulated batches per step"
        )
        where = f"{scale['num_nodes']} node(s) x {scale['devices_per_node']} device(s)"
        rate = f"; learning rate {scale['lr']:g} (not rescaled with the batch size)" if "lr" in scale else ""
        print(f"gridtnp: {tasks} ({where}, precision {scale['precision']}){rate}", flush=True)
    for logger in trainer.loggers:
        logger.log_hyperparams({f"scale/{key}": value for key, value in scale.items()})
    return scale
