"""Every rank's RNG states in a checkpoint: torch, CUDA, numpy and Python, so a resumed run draws the same tasks."""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """This process's torch, CUDA, numpy and Python RNG states, as types ``torch.load(weights_only=True)`` accepts."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos)}
        | {"has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states from ``rng_state``."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def all_gather_objects(trainer: L.Trainer, obj: Any) -> list[Any]:
    """``obj`` from every rank (a collective call), or ``[obj]`` when not distributed."""
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, obj)
        return gathered
    return [obj]
