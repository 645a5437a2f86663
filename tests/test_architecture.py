"""The shape of the house: imports flow one way, files stay small, and every registered component explains itself."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import gridtnp
from gridtnp.registry import KINDS, SHARED, arguments, available, build, describe, document, get

PACKAGE = Path(gridtnp.__file__).parent
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every gridtnp import in the file, at any depth (lazy imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("gridtnp")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gridtnp"):
            found += [(node.module, a.name) for a in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the gridtnp modules it imports (``from pkg import submodule`` points at the submodule)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for module, imported in imports(path):
            target = f"{module}.{imported}" if f"{module}.{imported}" in MODULES else module
            if target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_anywhere_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_private_name_is_imported_across_modules():
    offenders = [
        f"{name} imports {module}.{imported}"
        for name, path in MODULES.items()
        for module, imported in imports(path)
        if imported and imported.startswith("_") and module != name
    ]
    assert not offenders, offenders


def test_layers_do_not_import_upwards():
    """Imports flow down: nn <- models <- module <- inference <- report <- cli; data beside nn; training below the
    module and the CLI."""
    graph = import_graph()
    pipeline = ("gridtnp.inference", "gridtnp.report", "gridtnp.cli")
    above = {
        "gridtnp.nn": ("gridtnp.models", "gridtnp.module", "gridtnp.data", "gridtnp.training", *pipeline),
        "gridtnp.models": ("gridtnp.module", "gridtnp.data", "gridtnp.training", *pipeline),
        "gridtnp.data": ("gridtnp.nn", "gridtnp.models", "gridtnp.module", "gridtnp.training", *pipeline),
        "gridtnp.training": ("gridtnp.nn", "gridtnp.models", "gridtnp.module", "gridtnp.data", *pipeline),
        "gridtnp.module": pipeline,
        "gridtnp.inference": ("gridtnp.report", "gridtnp.cli"),
        "gridtnp.report": ("gridtnp.cli",),
        "gridtnp.registry": ("gridtnp.",),
        "gridtnp.batch": ("gridtnp.",),
        "gridtnp.files": ("gridtnp.nn", "gridtnp.models", "gridtnp.module", "gridtnp.cli", "gridtnp.data"),
    }
    offenders = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        for prefix, forbidden in above.items()
        if name.startswith(prefix)
        for target in targets
        if target.startswith(forbidden)
    ]
    assert not offenders, offenders


def test_discovery_is_by_import_not_by_a_list_of_module_names():
    """The registry imports nothing of gridtnp and no module by a name held in a string: packages register what they
    define when imported (the top package imports them on the first lookup), plugins through entry points."""
    registry = PACKAGE / "registry.py"
    assert not [m for m, _ in imports(registry)], "gridtnp.registry imports gridtnp modules"
    calls = [
        node
        for node in ast.walk(ast.parse(registry.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("import_module", "__import__")
    ]
    assert not calls, "gridtnp.registry imports modules by name"
    top = {name for name, _ in imports(PACKAGE / "__init__.py")} | set(import_graph()["gridtnp"])
    assert {"gridtnp.nn", "gridtnp.models"} <= top, "gridtnp/__init__.py imports the component packages statically"


def test_no_file_over_the_line_limit():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


COMPONENTS = [(kind, name) for kind in KINDS for name in available(kind) if not name.startswith("_test")]


@pytest.mark.parametrize(("kind", "name"), COMPONENTS, ids=[f"{k}:{n}" for k, n in COMPONENTS])
def test_every_component_documents_itself(kind, name):
    assert describe(kind, name), f"{kind} {name!r} has no one-line docstring"
    doc = inspect.getdoc(get(kind, name)).splitlines()
    assert len(doc) == 1 or not doc[1].strip(), "the first docstring line is a one-line summary: a blank line follows"
    undocumented = [a.name for a in arguments(kind, name) if not a.doc]
    assert not undocumented, f"{kind} {name!r}: arguments without a meaning in its docstring's Args: {undocumented}"
    text = document(kind, name)
    assert f"{kind} {name!r}" in text
    for arg in arguments(kind, name):
        assert f"  {arg.name}" in text


def test_document_marks_what_the_model_passes_in():
    swin = {a.name: a for a in arguments("processor", "swin")}
    assert swin["grid"].shared and swin["dim"].shared and not swin["window"].shared
    assert swin["window"].default == "4"
    assert "Set by the model unless the recipe sets them: grid, dim." in document("processor", "swin")
    for kind, shared in SHARED.items():  # every shared setting says what it is
        assert all(shared.values()), kind


def test_registry_entries_are_importable_from_their_stage_module():
    """A stage's components live in the module (or package) named for the stage."""
    stage_module = {
        "encoder": "gridtnp.nn.encoders",
        "grid_encoder": "gridtnp.nn.grid_encoders",
        "processor": "gridtnp.nn.processors",
        "grid_decoder": "gridtnp.nn.grid_decoders",
        "likelihood": "gridtnp.nn.likelihoods",
        "residual": "gridtnp.nn.residuals",
        "kriging": "gridtnp.nn.kriging",
        "embedding": "gridtnp.nn.embeddings",
    }
    for kind, module in stage_module.items():
        for name in available(kind):
            if not name.startswith("_test"):
                assert get(kind, name).__module__.startswith(module), (kind, name, get(kind, name).__module__)


def test_list_kind_name_prints_the_components_arguments(capsys):
    from gridtnp.cli import main

    main(["list", "processor", "swin"])
    out = capsys.readouterr().out
    assert out.startswith("processor 'swin' (gridtnp.nn.processors.grid_transformers.SwinProcessor)")
    assert "  window: int | Sequence[int] = 4" in out
    assert "Set by the model unless the recipe sets them: grid, dim." in out
    with pytest.raises(SystemExit) as err:
        main(["list", "processor", "swinn"])
    assert err.value.code == 2
    assert "Did you mean 'swin'" in capsys.readouterr().err


def test_print_config_expands_the_model_and_is_itself_a_recipe(tmp_path, capsys):
    import yaml

    from gridtnp.cli import main
    from gridtnp.models import build_model, count_parameters

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "gp1d_te_tnp.yaml"
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(recipe), "--print_config"])
    assert err.value.code == 0
    printed = capsys.readouterr().out
    model = yaml.safe_load(printed)["model"]["init_args"]
    assert model["processor"]["name"] == "te_transformer"
    assert model["processor"]["head_dim"] == 16 and model["processor"]["max_pairs"] == 2**16  # defaults spelled out
    assert model["grid_decoder"]["layers"] == model["processor"]["layers"]  # what the model passes in
    original = yaml.safe_load(recipe.read_text())["model"]["init_args"]
    keys = ("encoder", "grid_encoder", "processor", "grid_decoder", "likelihood", "dim", "dim_x", "dim_y")
    assert count_parameters(build_model({k: model[k] for k in keys})) == count_parameters(
        build_model({k: original[k] for k in keys if k in original})
    )
    (tmp_path / "expanded.yaml").write_text(printed)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(tmp_path / "expanded.yaml"), "--print_config"])
    assert capsys.readouterr().out == printed


def test_task_extras_are_declared_by_their_task():
    """The core table of extras holds what the core reads; the GP tasks declare theirs, and they are checked."""
    import ast as syntax

    import torch

    from gridtnp.batch import Batch, BatchError, Observations, declare_extras

    tree = syntax.parse((PACKAGE / "batch.py").read_text())
    core = next(
        node.value
        for node in syntax.walk(tree)
        if isinstance(node, syntax.AnnAssign) and getattr(node.target, "id", "") == "EXTRAS"
    )
    core_keys = {key.value for key in core.keys}
    assert not core_keys & {"kernel", "lengthscale", "period"}, core_keys
    build("task", "gp1d")  # importing the GP tasks declares their extras
    points = Observations(torch.zeros(2, 3, 1), torch.zeros(2, 3, 1))
    with pytest.raises(BatchError, match=r"extras\['lengthscale'\] must be \[B\]"):
        Batch({"points": points}, points, {"lengthscale": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="already declared with shape"):
        declare_extras("a test", {"lengthscale": ("[B, Nt]", "not the GP's")})
