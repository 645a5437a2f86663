"""Several training tasks from one read (``store.tasks_per_read``), the bytes a read costs (``ChunkCache.bytes_read``)
and the multi-source sampler's partial selection, pinned to the full sort it replaces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gridtnp.batch import Batch
from gridtnp.data import MultiSourceDataModule, StationReanalysisDataModule
from gridtnp.data.datamodules import generator_from
from gridtnp.data.era5.multisource import MultiSourceTask, first_by_key
from gridtnp.data.sections import StoreConfig, from_flat_arguments
from gridtnp.data.store_datamodule import masked_observations
from gridtnp.registry import ConfigError
from tests.data.test_era5_multisource import CHUNK, DATES, make_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_store(tmp_path_factory.mktemp("tasks_per_read"))


def multisource(store: str, **kwargs) -> MultiSourceDataModule:
    args = {"variables": ["u@850", "v@850", "u@500", "u10"], "target_variables": ["u@850", "v@850"], "window": 3}
    dm = from_flat_arguments(
        MultiSourceDataModule, store=store, batch_size=8, cache_chunks=1, **DATES, **{**args, **kwargs}
    )
    dm.setup()
    return dm


def reference_sample(task: MultiSourceTask, b: int, generator: torch.Generator, starts: np.ndarray) -> Batch:
    """The multi-source draws by full sorts, ties by index: the definition ``MultiSourceTask.sample`` keeps."""
    p = task.x.shape[0]
    pick = starts[torch.randint(len(starts), (b,), generator=generator).numpy()]
    steps = (pick[:, None] + np.arange(task.window)).reshape(-1)
    variables = list(dict.fromkeys(s.variable for s in task.sources))
    fields = dict(zip(variables, task.cache.read([(v, steps) for v in variables]), strict=True))
    values = {}
    for s in task.sources:
        field = fields[s.variable][:, task.level_index[s.name]] if s.name in task.level_index else fields[s.variable]
        values[s.name] = (field.reshape(b, p) - task.mean[s.name]) / task.std[s.name]
    n_t = max(round(task.target_fraction * p), 1)
    idx_t = torch.argsort(torch.rand(b, p, generator=generator), dim=1, stable=True)[:, :n_t].numpy()
    is_target = np.zeros((b, p), dtype=bool)
    np.put_along_axis(is_target, idx_t, True, axis=1)
    y_t = np.stack([np.take_along_axis(values[s.name], idx_t, 1) for s in task.targets], -1)
    low, high = task.context_fraction
    context = {}
    for s in task.sources:
        share = low + (high - low) * torch.rand(b, generator=generator, dtype=torch.float64).numpy()
        n_c = np.floor(share * p).astype(np.int64)
        order = torch.rand(b, p, generator=generator).numpy()
        if s in task.targets:
            order, n_c = np.where(is_target, 2.0, order), np.minimum(n_c, p - n_t)
        width = max(int(n_c.max()), 1)
        idx_c = np.argsort(order, axis=1, kind="stable")[:, :width]
        y_c = np.take_along_axis(values[s.name], idx_c, 1)[..., None]
        mask_c = (np.arange(width) < n_c[:, None]) & np.isfinite(y_c[..., 0])
        context[s.name] = masked_observations(task.x[torch.from_numpy(idx_c)], y_c, mask_c, s.name)
    target = masked_observations(task.x[torch.from_numpy(idx_t)], y_t, np.isfinite(y_t).all(-1), "target")
    return Batch(context, target, {"start_hour": torch.from_numpy(pick.astype(np.int64))})


def assert_same(a: Batch, b: Batch) -> None:
    pairs = [(a.target, b.target)] + [(a.context[k], b.context[k]) for k in a.context]
    for one, other in pairs:
        for name in ("x", "y", "mask"):
            assert torch.equal(getattr(one, name), getattr(other, name)), name
    assert torch.equal(a.extras["start_hour"], b.extras["start_hour"])


@pytest.mark.parametrize("k", [1, 5, 2_000, 4_095, 4_096])
def test_first_by_key_is_a_stable_sort_prefix_even_with_ties(k: int) -> None:
    keys = torch.rand(3, 4_096, generator=torch.Generator().manual_seed(k)).numpy().copy()
    keys[:, ::5] = keys[:, :1]  # a fifth of each row ties with its first key
    keys[1, 100:200] = 2.0  # the value excluded targets take
    expected = np.argsort(keys, axis=1, kind="stable")[:, :k]
    assert np.array_equal(first_by_key(keys, k), expected)


@pytest.mark.parametrize(
    "sources",
    [
        {},  # targets u@850 and v@850 of four sources, one of them single-level
        {"variables": ["u@850", "v@850", "u@500", "v@500"], "target_variables": None},  # every source a target
    ],
    ids=["two_targets", "table2_like"],
)
def test_multisource_draws_equal_the_full_sort_definition(store: str, sources: dict) -> None:
    dm = multisource(store, **sources)
    task, starts = dm.task, dm.starts["train"]
    for i in range(3):
        fast = task.sample(8, generator_from(0, "train", i), starts)
        slow = reference_sample(task, 8, generator_from(0, "train", i), starts)
        assert_same(fast, slow)


def test_default_tasks_per_read_draws_the_same_training_tasks(store: str) -> None:
    default, one = multisource(store), multisource(store, tasks_per_read=1)
    for i in range(2):
        generator = generator_from(0, "train", i)
        assert_same(
            default.split_task("train").sample(8, generator),
            one.split_task("train").sample(8, generator_from(0, "train", i)),
        )


def test_multisource_tasks_share_windows_with_their_own_draws(store: str) -> None:
    dm = multisource(store, tasks_per_read=4)
    batch = dm.split_task("train").sample(8, generator_from(0, "train", 0))
    hours = batch.extras["start_hour"].numpy()
    assert len(np.unique(hours)) <= 2 and (hours[:4] == hours[0]).all() and (hours[4:] == hours[4]).all()
    targets = batch.target.x.numpy()
    assert not np.array_equal(targets[0], targets[1])  # one window, different target points
    # Evaluation sets are the same whatever tasks_per_read.
    val = dm.eval_dataloader("val").dataset[0]
    assert_same(val, multisource(store).eval_dataloader("val").dataset[0])


def test_fewer_chunks_are_read_per_task(store: str) -> None:
    read = {}
    for k in (1, 8):
        dm = multisource(store, tasks_per_read=k)
        task = dm.split_task("train")
        for i in range(6):
            task.sample(8, generator_from(0, "train", i))
        cache, ds = dm.task.cache, dm.task.cache.dataset()
        per_chunk = {v: ds[v].isel(time=slice(0, CHUNK)).nbytes for v in cache.variables}  # equal chunks
        assert cache.bytes_read == sum(per_chunk[v] for v, _ in cache.loaded) > 0
        read[k] = cache.bytes_read
    assert read[8] < read[1]


def test_station_tasks_share_hours_with_their_own_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRIDTNP_CACHE", str(tmp_path))
    batches = {}
    for k in (1, 3):
        dm = from_flat_arguments(StationReanalysisDataModule, batch_size=6, tasks_per_read=k)
        dm.setup()
        batches[k] = dm.split_task("train").sample(6, generator_from(0, "train", 0))
    first_hour = torch.randint(len(dm.splits["train"].target_time), (6,), generator=generator_from(0, "train", 0))
    assert torch.equal(batches[1].extras["hour"], torch.from_numpy(dm.splits["train"].target_time[first_hour.numpy()]))
    hours = batches[3].extras["hour"].numpy()
    assert (hours[:3] == hours[0]).all() and (hours[3:] == hours[3]).all()
    stations = batches[3].context["stations"].x
    assert not torch.equal(stations[0], stations[1])  # one hour, another draw of the context stations


def test_tasks_per_read_must_be_a_positive_integer() -> None:
    with pytest.raises(ConfigError, match=r"store\.tasks_per_read must be an integer >= 1; got 0"):
        StoreConfig(tasks_per_read=0)
