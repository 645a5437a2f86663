"""The typed sections a task DataModule is composed of, each a small frozen dataclass that checks itself.

* ``LoaderConfig`` (``loader:``): batch size, batches per epoch and per evaluation set, seed, workers.
* ``StoreConfig`` (``store:``): a prepared Zarr store (or the embedded sample), how to read it and which box.
* ``SplitDates`` (``splits:``): the inclusive ``(start, end)`` dates of the train, val and test splits.

A recipe writes each as a nested mapping under ``data.init_args``::

    store: {path: era5.zarr, region: [49, 61, -11, 2], cache_chunks: 8}
    splits: {train: [2019-01-01, 2019-12-31], val: [2020-01-01, 2020-06-30], test: [2020-07-01, 2020-12-31]}
    loader: {batch_size: 16, train_batches: 200, num_workers: 4}

Each error names the section's key, the value it got and what is allowed (``loader.batch_size must be an integer
>= 1; got 0.``). ``moved_argument(cls, name)`` turns a recipe key of the flat layout (``batch_size``) into its new
place (``loader.batch_size``), for a one-line error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gridtnp.registry import ConfigError

SAMPLE_TRAIN_DATES = ("2019-03-01", "2019-03-21")
SAMPLE_VAL_DATES = ("2019-03-22", "2019-03-26")
SAMPLE_TEST_DATES = ("2019-03-27", "2019-03-31")


def check_count(key: str, value: object, smallest: int) -> None:
    """A ConfigError unless ``value`` is an integer >= ``smallest`` (``key``: where it was given)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < smallest:
        raise ConfigError(f"{key} must be an integer >= {smallest}; got {value!r}.")


def check_pair(key: str, value: object) -> tuple[Any, Any]:
    """``value`` as a 2-tuple, or a ConfigError naming ``key``."""
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
        raise ConfigError(f"{key} must be a pair [start, end]; got {value!r}.")
    return value[0], value[1]


def fraction_range(key: str, value: object) -> tuple[float, float]:
    """``(a, b)`` as floats, or a ConfigError naming ``key`` unless ``0 <= a <= b <= 1``."""
    try:
        low, high = (float(v) for v in check_pair(key, value))
    except (TypeError, ValueError):
        low, high = 1.0, 0.0
    if not 0.0 <= low <= high <= 1.0:
        raise ConfigError(f"{key} must be (a, b) with 0 <= a <= b <= 1; got {value!r}.")
    return low, high


@dataclass(frozen=True)
class LoaderConfig:
    """How tasks are batched and loaded (``loader:``).

    Args:
        batch_size: tasks per batch.
        train_batches: batches per training epoch over all ranks (each rank trains on its share, rounded up).
        val_batches: batches in the fixed validation set (DataModules whose evaluation covers dates ignore it).
        test_batches: batches in the fixed test set (likewise).
        seed: base seed of every split.
        num_workers: DataLoader worker processes (each opens its own handle on a store).
    """

    batch_size: int = 16
    train_batches: int = 100
    val_batches: int = 16
    test_batches: int = 64
    seed: int = 0
    num_workers: int = 0

    def __post_init__(self) -> None:
        for key, smallest in (("batch_size", 1), ("train_batches", 1), ("val_batches", 0), ("test_batches", 0)):
            check_count(f"loader.{key}", getattr(self, key), smallest)
        check_count("loader.num_workers", self.num_workers, 0)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"loader.seed must be an integer; got {self.seed!r}.")


@dataclass(frozen=True)
class StoreConfig:
    """Where the data is and how it is read (``store:``).

    Args:
        path: a prepared Zarr store (path or URL); None prepares the embedded ERA5 sample once into
            ``$GRIDTNP_CACHE`` (default ``~/.cache/gridtnp``) and reuses it.
        storage_options: fsspec options for a remote store, e.g. ``{"token": "anon"}``.
        convert_layout: accept a store that was not prepared by gridtnp (e.g. the public ARCO ERA5 store:
            latitudes descending, longitudes 0-360, other coordinate names) and convert it lazily on read.
        stats: ``{variable: [mean, std]}`` (``"u@850"`` for one level) used instead of the store's statistics,
            required for stores without them.
        allow_stats_overlap: accept a store whose statistics were computed over validation or test hours (by
            default that is refused: ``gridtnp data prepare --train-start/--train-end`` sets the period).
        cache_chunks: time chunks per variable kept in memory in each process.
        tasks_per_read: training tasks drawn from each time step (or window) read, each with its own context
            draw, stations and block layout (or targets): a batch of ``B`` holds ``ceil(B / tasks_per_read)``
            distinct hours and reads that many from storage. 1 (the default): every task its own random hour.
        local_cache: a folder on the node's own disk (e.g. ``${TMPDIR}/gridtnp-chunks``; environment
            variables are expanded) where each chunk file of a store on a shared filesystem is copied on its first
            read and read from afterwards by every process of the node. None (the default): read the store. A URL
            store caches the same way with fsspec's ``simplecache::`` prefix on its path.
        region: ``(lat_min, lat_max, lon_min, lon_max)`` in degrees (default: the whole store): only its spatial
            chunks are read (``lon_min > lon_max``: a box across the date line, read as one run past 180 degrees,
            140 to 200 for ``140, -160``).
    """

    path: str | None = None
    storage_options: dict[str, Any] | None = None
    convert_layout: bool = False
    stats: dict[str, list[float]] | None = None
    allow_stats_overlap: bool = False
    cache_chunks: int = 8
    region: tuple[float, float, float, float] | None = None
    tasks_per_read: int = 1
    local_cache: str | None = None

    def __post_init__(self) -> None:
        check_count("store.cache_chunks", self.cache_chunks, 1)
        if self.local_cache is not None and (not isinstance(self.local_cache, str) or not self.local_cache.strip()):
            raise ConfigError(f"store.local_cache must be a folder path or null; got {self.local_cache!r}.")
        check_count("store.tasks_per_read", self.tasks_per_read, 1)
        region = self.region
        if region is not None:
            if isinstance(region, str) or not isinstance(region, Sequence) or len(region) != 4:
                raise ConfigError(f"store.region must be [lat_min, lat_max, lon_min, lon_max]; got {region!r}.")
            object.__setattr__(self, "region", tuple(float(v) for v in region))
        for name, pair in (self.stats or {}).items():
            if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2 or float(pair[1]) <= 0:
                raise ConfigError(f"store.stats.{name} must be [mean, std] with std > 0; got {pair!r}.")


@dataclass(frozen=True)
class SplitDates:
    """The inclusive ``(start, end)`` date strings of each split (``splits:``); the splits must not overlap.

    Args:
        train: the training dates.
        val: the validation dates.
        test: the test dates.
    """

    train: tuple[str, str] = SAMPLE_TRAIN_DATES
    val: tuple[str, str] = SAMPLE_VAL_DATES
    test: tuple[str, str] = SAMPLE_TEST_DATES

    def __post_init__(self) -> None:
        for name in ("train", "val", "test"):
            start, end = check_pair(f"splits.{name}", getattr(self, name))
            object.__setattr__(self, name, (str(start), str(end)))

    def as_dict(self) -> dict[str, tuple[str, str]]:
        """``{"train": (start, end), "val": ..., "test": ...}``."""
        return {"train": self.train, "val": self.val, "test": self.test}


#: The default store and splits (frozen, so one instance serves every module): the embedded sample, March 2019.
DEFAULT_STORE = StoreConfig()
DEFAULT_SPLITS = SplitDates()


def section(kind: type, value: Any, key: str) -> Any:
    """``value`` as a ``kind`` section: kept if it is one, built from a mapping, the defaults for None."""
    if value is None:
        return kind()
    if isinstance(value, kind):
        return value
    if isinstance(value, dict):
        allowed = list(kind.__dataclass_fields__)
        unknown = [k for k in value if k not in allowed]
        if unknown:
            raise ConfigError(f"{key} has no key {unknown[0]!r}; its keys: {', '.join(allowed)}.")
        return kind(**value)
    raise ConfigError(f"{key} must be a mapping of {', '.join(kind.__dataclass_fields__)}; got {value!r}.")


def plain(value: Any) -> Any:
    """A section as plain dicts and lists (for hyper-parameters that checkpoints and loggers keep)."""
    return asdict(value) if hasattr(value, "__dataclass_fields__") else value


#: Where each argument of the flat layout went: ``{old name: new key}`` (shared by the store DataModules).
MOVED_STORE_ARGUMENTS: dict[str, str] = {
    **{name: f"loader.{name}" for name in LoaderConfig.__dataclass_fields__},
    "store": "store.path",
    **{name: f"store.{name}" for name in StoreConfig.__dataclass_fields__ if name != "path"},
    "train_dates": "splits.train",
    "val_dates": "splits.val",
    "test_dates": "splits.test",
}


def moved_argument(cls: type, name: str) -> str | None:
    """The new key of ``cls``'s flat-layout argument ``name`` (``"loader.batch_size"``), or None."""
    moved: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        moved.update(vars(klass).get("MOVED_ARGUMENTS", {}))
    return moved.get(name)


def from_flat_arguments(cls: type, *args: Any, **flat: Any) -> Any:
    """``cls(*args, ...)`` built from the flat keyword arguments of the old layout (``batch_size=4``,
    ``train_dates=...``), each put into its section (``loader={"batch_size": 4}``): Python code of the flat
    layout keeps working through this call."""
    kwargs: dict[str, Any] = {}
    for name, value in flat.items():
        moved = moved_argument(cls, name)
        if moved is None:
            kwargs[name] = value
            continue
        part, _, key = moved.partition(".")
        kwargs.setdefault(part, {})[key] = value
    return cls(*args, **kwargs)


def section_key_error(cls: type, section_name: str, key: str) -> str | None:
    """One line for a key that ``cls``'s section ``section_name`` does not have (with the closest key), or None
    when ``section_name`` is not one of its dataclass sections."""
    import difflib
    import inspect

    parameter = inspect.signature(cls.__init__).parameters.get(section_name)
    default = None if parameter is None else parameter.default
    if not hasattr(default, "__dataclass_fields__"):
        return None
    keys = list(default.__dataclass_fields__)
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"data.init_args.{section_name} of {cls.__name__} has no key {key!r}{hint}; its keys: {', '.join(keys)}."
