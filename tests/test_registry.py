import pytest
from torch import nn

import gridtnp
from gridtnp.registry import ConfigError, available, build, build_from_spec, get, register, unregister


def test_every_issue_component_is_registered():
    names = available()
    assert {"mlp", "identity"} <= set(names["encoder"])
    assert {"identity", "kernel_interpolation"} <= set(names["grid_encoder"])
    assert {"transformer", "mean", "ist", "perceiver", "cnn", "unet"} <= set(names["processor"])
    assert {"cross_attention", "concat", "kernel_interpolation"} <= set(names["grid_decoder"])
    assert {"gaussian", "homoscedastic"} <= set(names["likelihood"])
    assert {"cnp", "tnp", "pt_tnp_ist", "pt_tnp_perceiver", "convcnp"} <= set(names["model"])
    assert {"gp1d", "gp2d", "gp2d_multimodal", "sawtooth1d", "sawtooth2d", "sawtooth2d_restricted"} <= set(
        names["task"]
    )


def test_unknown_name_lists_close_matches_and_all_names():
    with pytest.raises(ConfigError) as err:
        get("processor", "transfomer")
    msg = str(err.value)
    assert "Unknown processor 'transfomer'" in msg
    assert "Did you mean 'transformer'" in msg
    for name in available("processor"):
        assert name in msg


def test_unknown_kind():
    with pytest.raises(ConfigError, match="Unknown component kind 'procesor'"):
        available("procesor")


def test_unknown_argument_names_accepted_ones():
    with pytest.raises(ConfigError) as err:
        build("processor", "transformer", dim=16, layres=2)
    msg = str(err.value)
    assert "'layres' (did you mean 'layers'?)" in msg
    assert "Accepted:" in msg and "heads" in msg


def test_build_from_spec_passes_only_accepted_shared_keys():
    block = build_from_spec("processor", {"name": "transformer", "layers": 2}, dim=16, grid=None, dim_x=3)
    assert block.num_states == 2
    assert block.blocks[0].norm1.normalized_shape == (16,)
    with pytest.raises(ConfigError, match="mapping with a 'name' key"):
        build_from_spec("processor", {"layers": 2})


def test_register_and_duplicate():
    @register("likelihood", "_test_dummy")
    class Dummy(nn.Module):
        """A dummy."""

    assert "_test_dummy" in available("likelihood")
    assert isinstance(build("likelihood", "_test_dummy"), Dummy)
    with pytest.raises(ConfigError, match="already registered"):
        register("likelihood", "_test_dummy")(type("Other", (nn.Module,), {}))
    assert unregister("likelihood", "_test_dummy") is Dummy
    assert "_test_dummy" not in available("likelihood")
    with pytest.raises(ConfigError, match="is not registered"):
        unregister("likelihood", "_test_dummy")


def test_package_exports():
    assert gridtnp.create_model("cnp").dim_x == 1


def test_a_rejected_value_becomes_a_config_error_the_cli_can_report():
    from gridtnp.nn.grids import Grid

    grid = Grid(lower=[0.0, 0.0], upper=[1.0, 1.0], shape=[4, 4])
    with pytest.raises(ConfigError, match=r"'knn'.*k .*must be >= 1"):
        build("grid_decoder", "knn", grid=grid, k=0)


def test_the_model_passes_each_component_what_shared_names(monkeypatch):
    """``SHARED[kind]`` is the one statement of what the model passes: a key added there reaches the component."""
    from gridtnp.models import build_model
    from gridtnp.registry import SHARED

    received: list[dict] = []

    @register("processor", "_test_recorder")
    class Recorder(nn.Module):
        """Records the keyword arguments it is built with; the latent is its one state."""

        def __init__(self, **kwargs) -> None:
            super().__init__()
            received.append(kwargs)

        def forward(self, latent):
            return [latent]

    spec = {"preset": "tnp", "dim_x": 2, "dim_y": 1, "dim": 8, "processor": {"name": "_test_recorder"}}
    try:
        build_model(spec)
        assert set(received[-1]) == set(SHARED["processor"]) == {"dim", "dim_x", "grid"}
        assert received[-1]["dim"] == 8 and received[-1]["dim_x"] == 2
        monkeypatch.setitem(SHARED, "processor", {**SHARED["processor"], "sources": "names of the context sources"})
        build_model(spec)
        assert received[-1]["sources"] == ["points"]
    finally:
        unregister("processor", "_test_recorder")


DOC_PAGES = ["docs/components.md", "docs/extending.md"]  # the pages with tables generated from the registry


def test_the_docs_tables_are_the_registrys(capsys):
    """``gridtnp list --docs PAGES --check``: the marked tables equal what the registry renders now."""
    from pathlib import Path

    from gridtnp.cli import main

    root = Path(__file__).resolve().parents[1]
    pages = [str(root / page) for page in DOC_PAGES]
    main(["list", "--docs", *pages, "--check"])
    assert capsys.readouterr().out == "", "stale tables: run gridtnp list --docs " + " ".join(DOC_PAGES)
    components = (root / "docs" / "components.md").read_text()
    for kind in ("processor", "datamodule", "task"):
        for name in available(kind):
            assert f"| `{kind}` | `{name}` |" in components


def test_a_stale_table_is_found_and_rewritten(tmp_path, capsys):
    from gridtnp.cli import main
    from gridtnp.registry import SHARED

    page = tmp_path / "page.md"
    page.write_text("Text.\n\n<!-- gridtnp list --markdown shared -->\n| old |\n<!-- end gridtnp list -->\n\nMore.\n")
    with pytest.raises(SystemExit) as err:
        main(["list", "--docs", str(page), "--check"])
    assert err.value.code == 1 and "stale" in capsys.readouterr().out
    assert "| old |" in page.read_text()  # --check changes nothing
    main(["list", "--docs", str(page)])
    text = page.read_text()
    assert text.startswith("Text.\n\n<!-- gridtnp list --markdown shared -->\n| kind |") and text.endswith("More.\n")
    assert all(f"| `{kind}` |" in text for kind, settings in SHARED.items() if settings)
    main(["list", "--docs", str(page), "--check"])  # now in step


def test_a_recipe_names_its_datamodule_by_registry_name(tmp_path):
    """``data: {class_path: synthetic}``: the registry name stands for the class's import path."""
    from pathlib import Path

    import yaml

    from gridtnp.cli import GridTNPCLI
    from gridtnp.cli.recipe_names import datamodule_path

    recipe = yaml.safe_load((Path(__file__).resolve().parents[1] / "recipes" / "gp1d_cnp.yaml").read_text())
    recipe["data"]["class_path"] = "synthetic"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    quiet = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    cli = GridTNPCLI(args=["--config", str(tmp_path / "recipe.yaml"), *quiet], run=False)
    assert type(cli.datamodule) is get("datamodule", "synthetic")
    assert datamodule_path("era5_stations").endswith(".StationReanalysisDataModule")
    assert datamodule_path("my_package.MyDataModule") == "my_package.MyDataModule"  # import paths pass unchanged


def test_a_failing_loader_fails_every_lookup_until_it_imports(monkeypatch):
    """An import error of gridtnp's own components is raised by each lookup, never hidden behind half a registry."""
    from gridtnp import registry

    calls = []

    def loader():
        calls.append(1)
        if len(calls) < 3:
            raise ImportError("a module of components is broken")

    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_loaders", [loader])
    for _ in range(2):
        with pytest.raises(ImportError, match="is broken"):
            available("processor")
    assert "transformer" in available("processor") and len(calls) == 3
    available("processor")
    assert len(calls) == 3  # loaded once
