"""docs/extending.md's worked examples run as written, and the guide has a section for every registry kind.

A fenced block whose info string says ``example=NAME`` (```` ```python example=encoder ````) is an example; blocks of
one name run one after the other in one fresh namespace, with tracebacks pointing at the guide's lines. A block with
``file=NAME.py`` is also the module the recipe example imports by its ``class_path``. Names the examples register
are removed from the registry again after each test, so other tests (the architecture and contract tests iterate over
every registered name) never see them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from torch import nn

from gridtnp.batch import Batch
from gridtnp.data.contract import OPTIONAL_ATTRIBUTES, optional
from gridtnp.models import NeuralProcess
from gridtnp.module import DATA_KEY, NeuralProcessModule
from gridtnp.registry import _REGISTRY, KINDS, ConfigError, available, build, get
from gridtnp.report.plots import is_geographic
from tests import test_architecture as architecture

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "extending.md"
STATIONS = ROOT / "tests" / "fixtures" / "stations.csv"
MAX_LINE = 120  # the repository's line length, in the examples too
ONE_LAYER = {"name": "transformer", "layers": 1}  # the preset's processor, one layer: fast
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]


@dataclass(frozen=True)
class Block:
    """A fenced code block of the guide: its language, ``key=value`` attributes, code and first line (1-based)."""

    language: str
    attributes: dict[str, str]
    code: str
    line: int


def guide_blocks() -> list[Block]:
    """Every fenced code block of docs/extending.md, in order."""
    text = GUIDE.read_text()
    found = []
    for match in re.finditer(r"^```(\w*)([^\n]*)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL):
        attributes = dict(item.split("=", 1) for item in match.group(2).split())
        line = text.count("\n", 0, match.start(3)) + 1
        found.append(Block(match.group(1), attributes, match.group(3), line))
    return found


BLOCKS = guide_blocks()
EXAMPLES: dict[str, list[Block]] = {}
for _block in BLOCKS:
    if "example" in _block.attributes:
        EXAMPLES.setdefault(_block.attributes["example"], []).append(_block)

#: Examples that add one registered component each: example name -> the kind it adds.
COMPONENT_EXAMPLES = {
    "registry": "processor",
    "encoder": "encoder",
    "grid_encoder": "grid_encoder",
    "processor": "processor",
    "grid_decoder": "grid_decoder",
    "likelihood": "likelihood",
    "embedding": "embedding",
    "model": "model",
}
#: Examples that run a backward pass through the model they build.
BACKWARD = ("encoder", "grid_encoder", "processor", "grid_decoder", "likelihood")
#: The kinds a user extends: each has a worked example in the guide.
EXTENDED_KINDS = ("encoder", "grid_encoder", "processor", "grid_decoder", "likelihood", "task", "datamodule")


@pytest.fixture
def registry() -> Iterator[None]:
    """Restore the registry after the test: the examples' names gone, everything else as it was."""
    available()  # import the lazily registered modules first, so that the snapshot holds them
    before = {kind: dict(table) for kind, table in _REGISTRY.items()}
    imported = "stations_csv" in sys.modules
    yield
    for kind, table in _REGISTRY.items():
        table.clear()
        table.update(before[kind])
    if not imported:  # the recipe example's DataModule file, imported from a temporary folder
        sys.modules.pop("stations_csv", None)


def run_example(name: str) -> dict[str, Any]:
    """Run the blocks of example ``name`` in one fresh namespace; errors point at the guide's lines."""
    namespace: dict[str, Any] = {"__name__": f"extending_{name}"}
    for block in EXAMPLES[name]:
        code = "\n" * (block.line - 1) + block.code
        exec(compile(code, str(GUIDE), "exec"), namespace)
    return namespace


def registered_since(before: dict[str, list[str]]) -> list[tuple[str, str]]:
    """``(kind, name)`` of every registry entry added since ``before``."""
    return [(kind, name) for kind in KINDS for name in available(kind) if name not in before[kind]]


def snapshot() -> dict[str, list[str]]:
    """The registered names of every kind."""
    return {kind: list(available(kind)) for kind in KINDS}


# --- the guide -----------------------------------------------------------------------------------------------------


def test_guide_has_a_section_for_every_kind():
    """A heading names each registry kind (a new kind fails here until the guide explains it)."""
    headings = [line for line in GUIDE.read_text().splitlines() if line.startswith("#")]
    missing = [kind for kind in KINDS if not any(f"(`{kind}`)" in h for h in headings)]
    assert not missing, f"docs/extending.md has no section headed '... (`KIND`)' for: {missing}"
    unexampled = [kind for kind in EXTENDED_KINDS if kind not in EXAMPLES]
    assert not unexampled, f"docs/extending.md has no worked example (```python example=KIND) for: {unexampled}"


def test_every_code_block_is_a_tested_example():
    untested = [b.line for b in BLOCKS if b.language in ("python", "yaml") and "example" not in b.attributes]
    assert not untested, f"code blocks of docs/extending.md without example=NAME (not run by a test), lines {untested}"
    tested_here = set(COMPONENT_EXAMPLES) | {"task", "datamodule", "recipe", "plugin"}
    assert set(EXAMPLES) == tested_here, f"examples without a test here: {sorted(set(EXAMPLES) - tested_here)}"
    long = [f"line {b.line + i}" for b in BLOCKS for i, line in enumerate(b.code.splitlines()) if len(line) > MAX_LINE]
    assert not long, f"example lines over {MAX_LINE} characters in docs/extending.md: {long}"


# --- components ----------------------------------------------------------------------------------------------------


def component_in(model: NeuralProcess, kind: str) -> nn.Module:
    """The component of ``kind`` in ``model``."""
    encoder = model.encoders[model.target_source]
    return {"encoder": encoder, "embedding": getattr(encoder, "embed", None)}.get(kind) or getattr(model, kind)


@pytest.mark.parametrize("example", sorted(COMPONENT_EXAMPLES))
def test_component_example_runs_and_keeps_the_rules(example, registry):
    kind = COMPONENT_EXAMPLES[example]
    before = snapshot()
    namespace = run_example(example)
    added = registered_since(before)
    assert [k for k, _ in added] == [kind], f"example {example!r} registered {added}, expected one {kind}"
    name = added[0][1]
    assert name.startswith("example_"), "the guide's examples register names that start with example_"
    architecture.test_every_component_documents_itself(kind, name)  # the rules every registered name keeps
    if example == "registry":
        assert type(namespace["processor"]) is get(kind, name)
        return
    model = namespace["model"]
    assert isinstance(model, NeuralProcess)
    if kind == "model":
        return
    component = component_in(model, kind)
    assert type(component) is get(kind, name), f"the example's model does not hold its {kind}"
    if example in BACKWARD:
        missing = [n for n, p in component.named_parameters() if p.grad is None]
        assert not missing, f"{kind} {name!r}: no gradient reached {missing}"


def test_registered_examples_leave_the_registry():
    """Nothing the examples register outlives their test (the fixture restores the registry)."""
    leftovers = [(kind, name) for kind in KINDS for name in available(kind) if name.startswith("example_")]
    assert not leftovers


# --- a synthetic task ----------------------------------------------------------------------------------------------


def test_task_example_draws_valid_seeded_batches(registry):
    namespace = run_example("task")
    task = build("task", "example_sine", min_context=2, max_context=5, num_targets=3)
    first = task.sample(6, torch.Generator().manual_seed(1))
    again = task.sample(6, torch.Generator().manual_seed(1))
    other = task.sample(6, torch.Generator().manual_seed(2))
    assert isinstance(first, Batch) and first.target.y.shape == (6, 3, 1)
    context = first.context["points"]
    assert context.x.shape[1] <= 5 and bool((context.mask.sum(1) >= 2).all())
    assert torch.equal(first.target.y, again.target.y) and not torch.equal(first.target.y, other.target.y)
    assert bool((context.y[~context.mask] == 0).all())  # padding is zeroed
    with pytest.raises(ConfigError, match="x_range"):
        build("task", "example_sine", x_range=(1.0, -1.0))
    data = namespace["data"]
    batch = next(iter(data.train_dataloader()))
    assert isinstance(batch, Batch) and batch.batch_size == 4
    module = NeuralProcessModule(preset="tnp", dim=16, dim_x=1, dim_y=1, processor=ONE_LAYER)
    trainer = L.Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, accelerator="cpu", enable_progress_bar=False
    )
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 2


# --- a DataModule for a new data source ----------------------------------------------------------------------------


def fit_one_step(module: NeuralProcessModule, data: L.LightningDataModule) -> None:
    """Train ``module`` on ``data`` for one step on the CPU, without logs, checkpoints or progress bars."""
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=data)


def test_datamodule_example_trains_and_offers_its_optional_attributes(registry, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the example reads tests/fixtures/stations.csv
    namespace = run_example("datamodule")
    trainer, data, module = namespace["trainer"], namespace["data"], namespace["module"]
    assert trainer.global_step == 2
    assert "example_station_csv" in available("datamodule")

    # The optional attributes it offers are found where gridtnp looks, and switch on what they should.
    offered = [name for name in OPTIONAL_ATTRIBUTES if optional(data, name) is not None]
    assert offered == ["dim_x", "dim_y", "variable_metadata", "predictions_to_xarray", "geographic", "batch_size"]
    assert is_geographic(data)
    for dim_x, dim_y in ((1, {"stations": 1}), (2, {"points": 1}), (2, {"stations": 2})):
        wrong = NeuralProcessModule(preset="tnp", dim=16, dim_x=dim_x, dim_y=dim_y, processor=ONE_LAYER)
        with pytest.raises(ConfigError, match="StationCSVDataModule"):
            fit_one_step(wrong, data)

    # The checkpoint keeps the data's statistics; predictions come back in kelvin on (time, station).
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    saved = torch.load(tmp_path / "model.ckpt", map_location="cpu", weights_only=False)[DATA_KEY]
    table = pd.read_csv(STATIONS, parse_dates=["time"])
    train_hours = sorted(table.time.unique())[: -data.val_hours - data.test_hours]
    assert saved["variables"]["t2m"]["mean"] == pytest.approx(table[table.time.isin(train_hours)].t2m.mean(), abs=1e-3)
    assert saved["variables"]["t2m"]["units"] == "K"
    outputs = trainer.predict(module, datamodule=data)
    ds = data.predictions_to_xarray(outputs)
    assert ds["t2m_mean"].dims == ("time", "station") and ds.sizes["time"] == data.test_hours
    assert ds["t2m_mean"].attrs["units"] == "K"
    assert abs(float(ds["t2m_mean"].mean()) - table.t2m.mean()) < 5 * table.t2m.std()  # physical units
    assert int(ds["t2m_mean"].notnull().sum()) == sum(int(o["mask"].sum()) for o in outputs)


# --- a recipe ------------------------------------------------------------------------------------------------------


def test_recipe_example_trains_with_the_cli(registry, monkeypatch, tmp_path):
    """The recipe runs as written, with the example processor and the example DataModule's file on the path."""
    from gridtnp.cli import main

    run_example("processor")  # registers example_pointwise, as its module in gridtnp would on import
    module_file = next(b for b in EXAMPLES["datamodule"] if "file" in b.attributes)
    (tmp_path / module_file.attributes["file"]).write_text(module_file.code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GRIDTNP_ALLOW_IMPORTS", "stations_csv")  # a module outside gridtnp and its plugins
    monkeypatch.chdir(ROOT)
    (recipe,) = EXAMPLES["recipe"]
    (tmp_path / "recipe.yaml").write_text(recipe.code)
    args = ["--config", str(tmp_path / "recipe.yaml"), "--trainer.default_root_dir", str(tmp_path), *QUIET]
    main(["fit", *args, "--trainer.max_steps", "2", "--checkpoint.dirpath", str(tmp_path / "run")])
    checkpoint = torch.load(tmp_path / "run" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 2
    assert checkpoint["hyper_parameters"]["processor"]["name"] == "example_pointwise"
    assert checkpoint[DATA_KEY]["variables"]["t2m"]["units"] == "K"  # the DataModule's variable_metadata()
    # gridtnp predict writes what the DataModule's predictions_to_xarray makes of the outputs.
    out = tmp_path / "predictions.nc"
    main(["predict", *args, "--ckpt_path", str(tmp_path / "run" / "last.ckpt"), "--predictions.path", str(out)])
    with xr.open_dataset(out) as ds:
        assert ds["t2m_mean"].dims == ("time", "station") and ds["t2m_mean"].attrs["units"] == "K"


# --- a plugin package ---------------------------------------------------------------------------------------------


def install_plugin(root: Path) -> None:
    """Install the guide's plugin example into ``root`` as pip would (its files and a ``dist-info`` holding the
    entry points of its pyproject.toml), without network or a build."""
    import tomllib

    files = {b.attributes["file"]: b.code for b in EXAMPLES["plugin"]}
    project = tomllib.loads(files.pop("pyproject.toml"))["project"]
    for name, code in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(code)
    info = root / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, entries in project["entry-points"].items():
        lines += [f"[{group}]", *(f"{k} = {v}" for k, v in entries.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def test_plugin_example_is_found_by_gridtnp_list(registry, monkeypatch, tmp_path, capsys):
    """A package with a ``gridtnp.components`` entry point: its processor is listed and builds into a model."""
    import importlib

    from gridtnp import registry as registry_module
    from gridtnp.cli import main

    install_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(registry_module, "_loaded", False)  # as in a fresh process: entry points not yet loaded
    monkeypatch.delitem(sys.modules, "gridtnp_example_plugin", raising=False)
    main(["list", "processor"])
    assert re.search(r"^  example_plugin_scale +Scales every pseudo-token", capsys.readouterr().out, re.MULTILINE)
    model = gridtnp_model({"name": "example_plugin_scale"})
    assert type(model.processor).__module__ == "gridtnp_example_plugin"
    sys.modules.pop("gridtnp_example_plugin", None)


def test_a_broken_plugin_is_skipped_with_a_warning(registry, monkeypatch, tmp_path):
    import importlib

    from gridtnp import registry as registry_module

    install_plugin(tmp_path)
    (tmp_path / "gridtnp_example_plugin" / "__init__.py").write_text("raise ImportError('missing dependency')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(registry_module, "_loaded", False)
    monkeypatch.delitem(sys.modules, "gridtnp_example_plugin", raising=False)
    with pytest.warns(UserWarning, match=r"plugin 'example_plugin' \(gridtnp_example_plugin.*missing dependency"):
        names = available("processor")
    assert "example_plugin_scale" not in names and "transformer" in names


def gridtnp_model(processor: dict[str, Any]) -> NeuralProcess:
    """A small TNP with ``processor`` in its processor slot."""
    from gridtnp.models import build_model

    return build_model({"preset": "tnp", "dim_x": 1, "dim_y": 1, "dim": 8, "processor": processor})


# --- the fake station data -----------------------------------------------------------------------------------------


def fake_stations(path: Path) -> None:
    """Write the fake hourly station file of the DataModule example: 8 invented stations over 48 hours, a smooth
    temperature field (a daily cycle, colder northwards) plus noise, in kelvin; about 5 % of the reports missing."""
    rng = np.random.default_rng(0)
    stations = [(f"S{i:02d}", 50.0 + 8.0 * rng.random(), -5.0 + 6.0 * rng.random()) for i in range(8)]
    lines = ["time,station,latitude,longitude,t2m"]
    for hour, time in enumerate(pd.date_range("2019-03-01", periods=48, freq="h")):
        for name, lat, lon in stations:
            value = 279.0 + 3.0 * np.sin(2 * np.pi * (hour - 9) / 24) - 0.5 * (lat - 54.0) + rng.normal(0.0, 0.5)
            if rng.random() >= 0.05:
                lines.append(f"{time:%Y-%m-%dT%H:%M},{name},{lat:.3f},{lon:.3f},{value:.2f}")
    path.write_text("\n".join(lines) + "\n")


def test_fake_station_file_is_what_the_generator_writes(tmp_path):
    fake_stations(tmp_path / "stations.csv")
    assert (tmp_path / "stations.csv").read_text() == STATIONS.read_text(), "regenerate with fake_stations()"
