"""How a run is scaled out: ranks, effective batch size, learning rate and epoch length, reported once at the start
of ``fit``."""

from __future__ import annotations

from typing import Any

import lightning as L

from gridtnp.training.lr_scaling import LrScaling, effective_batch


def training_scale(
    trainer: L.Trainer,
    lr: float | None = None,
    batch_size: int | None = None,
    scaling: LrScaling | None = None,
    train_batches: int | None = None,
) -> dict[str, Any]:
    """World size, tasks per optimiser step, learning rate and epoch length of a run set up by ``trainer``
    (``batch_size``: the DataModule's tasks per batch; ``lr``: the recipe's rate, which ``scaling`` scales with the
    effective batch; ``train_batches``: global batches per epoch; None: not reported).

    DDP averages gradients over ranks, so one optimiser step sees ``batch_size x world_size x accumulate_grad_batches``
    tasks; the learning rate follows it only with ``lr_scaling`` (``gridtnp.training.lr_scaling``).
    """
    accumulate = int(trainer.accumulate_grad_batches)
    world = int(trainer.world_size)
    scale: dict[str, Any] = {
        "world_size": world,
        "num_nodes": int(trainer.num_nodes),
        "devices_per_node": int(trainer.num_devices),
        "accumulate_grad_batches": accumulate,
        "precision": str(trainer.precision),
    }
    if batch_size is not None:
        scale["batch_size_per_rank"] = int(batch_size)
        scale["effective_batch_size"] = effective_batch(trainer, batch_size)
    if lr is not None:
        scaling = scaling or LrScaling()
        scale["lr"] = float(scaling.lr(lr, scale.get("effective_batch_size")))
        scale["lr_recipe"], scale["lr_scaling"] = float(lr), scaling.rule
        if scaling.base_batch is not None:
            scale["lr_base_batch"] = int(scaling.base_batch)
    if train_batches is not None:
        scale["train_batches_global"] = int(train_batches)
        scale["train_batches_per_rank"] = -(-int(train_batches) // world)
    return scale


def report_training_scale(
    trainer: L.Trainer,
    lr: float | None = None,
    batch_size: int | None = None,
    scaling: LrScaling | None = None,
    train_batches: int | None = None,
) -> dict[str, Any]:
    """Print the scale on global rank 0 and add it to every logger's hyperparameters; returns it."""
    scale = training_scale(trainer, lr, batch_size, scaling, train_batches)
    if trainer.is_global_zero:
        tasks = (
            f"effective batch size {scale['effective_batch_size']} tasks per step "
            f"= {scale['batch_size_per_rank']} per rank x {scale['world_size']} ranks "
            f"x {scale['accumulate_grad_batches']} accumulated"
            if "effective_batch_size" in scale
            else f"{scale['world_size']} ranks x {scale['accumulate_grad_batches']} accumulated batches per step"
        )
        where = f"{scale['num_nodes']} node(s) x {scale['devices_per_node']} device(s)"
        parts = [f"gridtnp: {tasks} ({where}, precision {scale['precision']})"]
        if "lr" in scale:
            parts.append((scaling or LrScaling()).describe(scale["lr_recipe"], scale.get("effective_batch_size")))
        if "train_batches_global" in scale:
            parts.append(
                f"epoch {scale['train_batches_global']} global batches ({scale['train_batches_per_rank']} per rank); "
                "validation and test sets and their limits count global batches, the same at any world size"
            )
        print("; ".join(parts), flush=True)
    for logger in trainer.loggers:
        logger.log_hyperparams({f"scale/{key}": value for key, value in scale.items()})
    return scale
