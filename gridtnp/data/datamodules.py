"""The task DataModules' shared loaders (``TaskDataModule``) and ``SyntheticDataModule``, which draws synthetic
tasks on the fly.

* ``TaskDataModule(loader)``: subclasses give ``split_task(split) -> Task``; it builds the training stream and the fixed
  validation / test sets, each batch a ``Batch`` of ``batch_size`` tasks.
* ``SyntheticDataModule(task, loader, test_task)``: a registered task generator (``gridtnp.data.tasks``) for each
  split.
* ``TrainTaskStream``, ``FixedTaskSet``, ``ShardSampler``: the datasets and the evaluation sampler behind them;
  ``seed_from(*parts)``, ``generator_from(*parts)``: the seeds below.

Seeding, so that a rerun with the same ``seed`` sees exactly the same data:

* an epoch is ``train_batches`` global batches: rank ``r`` of ``n`` trains on global batches ``g = r, r + n, ...``,
  ``ceil(train_batches / n)`` of them (the ranks step together, so the last round is completed with fresh batches);
  global batch ``g`` of epoch ``e`` comes from a generator seeded with ``(seed, "train", 0, e, g)``, so an epoch
  draws the same tasks at any world size (one rank: the same as before ranks shared epochs); dataloader worker
  ``w`` of ``W`` produces a rank's batches ``w, w + W, ...``, so the batches do not depend on the number of workers;
* validation / test batch ``i`` comes from ``(seed, "val" | "test", i)``: fixed sets, identical for any number of
  workers and ranks; ``limit_val_batches`` / ``limit_test_batches`` keep the first batches of the whole set
  (``gridtnp.data.eval_limits``); with several ranks, rank ``r`` of ``n`` evaluates batches ``r, r + n, ...``
  (``ShardSampler``), so every batch is evaluated exactly once and the metrics reduced across ranks equal the
  metrics over the whole set (Lightning's default DistributedSampler would pad the shards by repeating batches).

Resuming: the training loader is stateful (``state_dict`` / ``load_state_dict``, saved by Lightning in the
checkpoint): it records the epoch and how many of its batches training has consumed, and a resumed run continues
with the next batch of that epoch instead of replaying the epoch from its start.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, get_worker_info

from gridtnp.batch import Batch
from gridtnp.data.contract import GridDataModule
from gridtnp.data.eval_limits import limit_globally
from gridtnp.data.freed_memory import worker_init
from gridtnp.data.sections import LoaderConfig, plain, section
from gridtnp.data.tasks import Task
from gridtnp.registry import ConfigError, build_from_spec, register


def seed_from(*parts: object) -> int:
    """A 63-bit seed mixed from ``parts`` (stable across processes and platforms, unlike ``hash``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def generator_from(*parts: object) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from ``parts``."""
    return torch.Generator().manual_seed(seed_from(*parts))


class TrainTaskStream(IterableDataset):
    """Endless-task training data: ``num_batches`` global batches per epoch, shared by ``world_size`` ranks, fresh
    each epoch; this rank's share is global batches ``rank, rank + world_size, ...``."""

    def __init__(
        self, task: Task, batch_size: int, num_batches: int, seed: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"TrainTaskStream: rank {rank} is not one of the {world_size} ranks (0 to world_size-1).")
        self.task, self.batch_size, self.num_batches = task, batch_size, num_batches
        self.seed, self.rank, self.world_size = seed, rank, world_size
        # (epoch, first batch index of the next iteration) in shared memory: persistent DataLoader workers, which
        # keep their copy of this stream (and their open store and chunk cache) across epochs, read them from here.
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._position[0])

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._position[0] = int(value)

    @property
    def start(self) -> int:
        """First batch index of the next iteration: > 0 when resuming mid-epoch."""
        return int(self._position[1])

    @start.setter
    def start(self, value: int) -> None:
        self._position[1] = int(value)

    def set_epoch(self, epoch: int) -> None:
        """Draw the tasks of ``epoch`` on the next iteration."""
        self.epoch = int(epoch)

    def generator(self, index: int, epoch: int | None = None) -> torch.Generator:
        """The generator for this rank's batch ``index`` of ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        # The 0 stands where the rank was when each rank drew its own epoch: one rank keeps its old tasks.
        return generator_from(self.seed, "train", 0, epoch, self.rank + self.world_size * index)

    def __len__(self) -> int:
        """This rank's batches per epoch: ``ceil(num_batches / world_size)``."""
        return -(-self.num_batches // self.world_size)

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch, start = self.epoch, self.start
        for index in range(start + worker, len(self), workers):
            yield self.task.sample(self.batch_size, self.generator(index, epoch))


class FixedTaskSet(Dataset):
    """A fixed evaluation set: batch ``i`` is always drawn from the generator seeded with ``(seed, split, i)``."""

    def __init__(self, task: Task, batch_size: int, num_batches: int, seed: int = 0, split: str = "val") -> None:
        self.task, self.batch_size, self.num_batches = task, batch_size, num_batches
        self.seed, self.split = seed, split

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"{self.split} set has {self.num_batches} batches; got index {index}.")
        return self.task.sample(self.batch_size, generator_from(self.seed, self.split, int(index)))


class ShardSampler(DistributedSampler):
    """Rank ``r`` of ``n`` reads items ``r, r + n, ...``: each item exactly once over all ranks, without padding.

    A ``DistributedSampler`` subclass so that Lightning keeps it instead of injecting its own, padded one; ranks may
    get one item more than others, which is fine for evaluation (no gradient synchronisation).
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, len(self.dataset), self.num_replicas))


class _EpochLoader(DataLoader):
    """A resumable DataLoader that tells its TrainTaskStream the epoch each time an iteration starts.

    Lightning only calls ``set_epoch`` on samplers, which an IterableDataset does not have. The epoch comes from
    ``epoch_fn`` (the trainer's ``current_epoch``), or counts iterations when that returns None. Workers are
    persistent (with ``num_workers > 0``): the stream keeps its epoch and start in shared memory, so the same
    workers, their store handles and chunk caches serve every epoch.

    ``state_dict`` holds the epoch and ``consumed_fn()``, the number of its batches that training has finished
    (Lightning prefetches, so the count of batches handed out would be ahead); after ``load_state_dict`` the next
    iteration starts at the first unconsumed batch, or at the next epoch if that one was complete.
    """

    def __init__(
        self,
        dataset: TrainTaskStream,
        epoch_fn: Callable[[], int | None],
        consumed_fn: Callable[[], int | None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self._epoch_fn, self._consumed_fn = epoch_fn, consumed_fn
        self._iterations = 0
        self._resume_at: tuple[int, int] | None = None  # (epoch, first batch) of the next iteration

    def __iter__(self) -> Any:
        if self._resume_at is not None:
            epoch, start = self._resume_at
            self._resume_at = None
        else:
            epoch, start = self._epoch_fn(), 0
            epoch = self._iterations if epoch is None else epoch
        self.dataset.set_epoch(epoch)
        self.dataset.start = start
        self._iterations = epoch + 1
        return super().__iter__()

    def state_dict(self) -> dict[str, int]:
        """Where the training stream stands: ``seed``, ``epoch``, batches ``consumed`` on each rank of ``num_batches``
        global ones, ``world_size``."""
        consumed = self._consumed_fn()
        stream = self.dataset
        return {
            "seed": int(stream.seed),
            "epoch": int(stream.epoch),
            "consumed": int(stream.start if consumed is None else consumed),
            "num_batches": int(stream.num_batches),
            "world_size": int(stream.world_size),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the stream after the last consumed batch of ``state``."""
        stream = self.dataset
        if state.get("seed", stream.seed) != stream.seed:
            rank_zero_warn(
                f"gridtnp: resuming with data seed {stream.seed}, the checkpoint's stream used {state['seed']}; "
                "the remaining tasks are drawn with the new seed."
            )
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        # At another world size the ranks go on after the global batches consumed (rounded up to whole rounds).
        consumed = -(-consumed * int(state.get("world_size", 1)) // stream.world_size)
        self._resume_at = (epoch + 1, 0) if consumed >= len(stream) else (epoch, consumed)


#: The synthetic DataModule's loader defaults: 1,000 training batches, fixed sets of 32 and 64 batches.
SYNTHETIC_LOADER = LoaderConfig(batch_size=16, train_batches=1000, val_batches=32, test_batches=64)


class TaskDataModule(GridDataModule, ABC):
    """Loaders shared by every task DataModule: an endless training stream per rank and fixed val/test sets.

    Subclasses say which task generator serves each split with ``split_task``, and with ``keep_freed_memory``
    whether their DataLoader workers keep freed memory in their heap (``gridtnp.data.freed_memory``): worth it
    where each batch allocates and frees arrays of many MiB. ``loader`` (``LoaderConfig``) sizes the batches.
    """

    keep_freed_memory = False

    def __init__(self, loader: LoaderConfig | None = None) -> None:
        super().__init__()
        self.loader = section(LoaderConfig, loader, "loader")
        self.batch_size, self.seed, self.num_workers = self.loader.batch_size, self.loader.seed, self.loader.num_workers
        self.train_batches, self.val_batches = self.loader.train_batches, self.loader.val_batches
        self.test_batches = self.loader.test_batches
        self._eval_limits: dict[str, float] = {}  # fractional evaluation limits taken over from the trainer

    @abstractmethod
    def split_task(self, split: str) -> Task:
        """The task generator of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""

    def _rank(self) -> int:
        return int(getattr(self.trainer, "global_rank", 0) or 0)

    def _world_size(self) -> int:
        return int(getattr(self.trainer, "world_size", 1) or 1)

    def _epoch(self) -> int | None:
        return None if self.trainer is None else int(self.trainer.current_epoch)

    def _consumed(self) -> int | None:
        """Training batches of the current epoch whose step has finished (Lightning's progress counter)."""
        if self.trainer is None:
            return None
        return int(self.trainer.fit_loop.epoch_loop.batch_progress.current.processed)

    def train_dataset(self) -> TrainTaskStream:
        """This global rank's share of the training stream (``train_batches`` global batches an epoch)."""
        task, world = self.split_task("train"), self._world_size()
        return TrainTaskStream(task, self.batch_size, self.train_batches, self.seed, self._rank(), world)

    def eval_dataset(self, split: str) -> FixedTaskSet:
        """The whole fixed ``"val"`` or ``"test"`` set (the same on every rank; the loader shards it)."""
        num = self.val_batches if split == "val" else self.test_batches
        return FixedTaskSet(self.split_task(split), self.batch_size, num, self.seed, split)

    def loader_kwargs(self) -> dict[str, Any]:
        """What every loader of this module shares: pre-batched tasks (``batch_size=None``), workers (keeping
        their freed memory for the next batch where ``keep_freed_memory``), pinned memory."""
        return {
            "batch_size": None,
            "num_workers": self.num_workers,
            "worker_init_fn": worker_init if self.num_workers > 0 and self.keep_freed_memory else None,
            "pin_memory": torch.cuda.is_available(),
        }

    def train_dataloader(self) -> DataLoader:
        return _EpochLoader(
            self.train_dataset(),
            self._epoch,
            self._consumed,
            persistent_workers=self.num_workers > 0,
            **self.loader_kwargs(),
        )

    def eval_dataloader(self, split: str) -> DataLoader:
        """The ``"val"`` or ``"test"`` loader; with several ranks, this rank's shard (``ShardSampler``)."""
        dataset, world = self.eval_dataset(split), self._world_size()
        dataset = limit_globally(dataset, self.trainer, self._eval_limits)
        sampler = None
        if world > 1:
            if 0 < len(dataset) < world:
                raise ConfigError(
                    f"{type(self).__name__}: the {split} set has {len(dataset)} batch(es) (after the trainer's limit), "
                    f"fewer than the {world} ranks; every rank must evaluate a batch: raise {split}_batches or "
                    f"limit_{split}_batches (or, for sets that cover dates, lower batch_size or raise eval_draws)."
                )
            sampler = ShardSampler(dataset, world, self._rank())
        # Persistent workers: each validation run reuses the workers (their open store, tables and chunk cache)
        # instead of starting them again; the fixed set's batches depend on their index only, not on the worker.
        persistent = self.num_workers > 0
        return DataLoader(
            dataset, sampler=sampler, shuffle=False, persistent_workers=persistent, **self.loader_kwargs()
        )

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")

    def predict_dataloader(self) -> DataLoader:
        """``gridtnp predict`` runs over the fixed test set unless a subclass says otherwise."""
        return self.test_dataloader()


@register("datamodule", "synthetic")
class SyntheticDataModule(TaskDataModule):
    """Synthetic meta-learning tasks drawn on the fly from a registered task generator.

    Args:
        task: a task spec ``{"name": "gp1d", **kwargs}`` or a bare registered task name.
        loader: batch size, batches per epoch and per fixed evaluation set, seed, workers (``LoaderConfig``).
        test_task: the test split's task when it differs from ``task`` (a shifted or rotated test set); it must
            have the same ``dim_x`` and ``dim_y``.
    """

    MOVED_ARGUMENTS = {name: f"loader.{name}" for name in LoaderConfig.__dataclass_fields__}

    def __init__(
        self,
        task: dict[str, Any] | str,
        loader: LoaderConfig = SYNTHETIC_LOADER,
        test_task: dict[str, Any] | str | None = None,
    ) -> None:
        super().__init__(loader)
        self.save_hyperparameters({"task": task, "loader": plain(self.loader), "test_task": test_task})
        self.task: Task = self._build_task(task)
        self.test_task: Task = self.task if test_task is None else self._build_task(test_task)
        if (self.test_task.dim_x, dict(self.test_task.dim_y)) != (self.task.dim_x, dict(self.task.dim_y)):
            raise ConfigError(
                f"SyntheticDataModule: test_task has dim_x={self.test_task.dim_x}, dim_y={dict(self.test_task.dim_y)} "
                f"but task has dim_x={self.task.dim_x}, dim_y={dict(self.task.dim_y)}; one model must fit both."
            )

    @staticmethod
    def _build_task(task: dict[str, Any] | str) -> Task:
        built = build_from_spec("task", task)
        if not isinstance(built, Task):
            raise ConfigError(
                f"SyntheticDataModule: task {task!r} built a {type(built).__name__}, which lacks the task "
                "interface (dim_x, dim_y, target_dim_y, sample(batch_size, generator))."
            )
        return built

    @property
    def dim_x(self) -> int:
        """Input dimension of the task."""
        return self.task.dim_x

    @property
    def dim_y(self) -> dict[str, int]:
        """Output dimension per context source."""
        return dict(self.task.dim_y)

    def split_task(self, split: str) -> Task:
        """Training and validation draw from ``task``, the test split from ``test_task`` (each with its own seeds)."""
        return self.test_task if split == "test" else self.task
