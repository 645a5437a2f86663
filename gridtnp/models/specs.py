"""A model specification -> a ``NeuralProcess``: presets resolved, shared settings passed, every default spelled out.

A specification is a plain mapping (what a YAML recipe's ``model.init_args`` holds)::

    {"dim_x": 1, "dim_y": 1, "dim": 128,
     "encoder": {"name": "mlp"}, "grid_encoder": {"name": "identity"},
     "processor": {"name": "transformer", "layers": 5},
     "grid_decoder": {"name": "cross_attention", "layers": 5}, "likelihood": {"name": "gaussian"}}

``build_model`` passes each component the settings ``registry.SHARED`` names for its kind (those its constructor
takes, unless the spec sets them); ``expand_spec`` gives the specification as built.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from gridtnp.batch import DEFAULT_SOURCE
from gridtnp.models.neural_process import NeuralProcess
from gridtnp.nn.grids import Grid, as_grid
from gridtnp.registry import SHARED, ConfigError, accepted_arguments, get, spec_arguments, with_defaults
from gridtnp.registry import build as build_component

SLOTS = ("encoder", "grid_encoder", "processor", "grid_decoder", "likelihood")
MODEL_KEYS = (
    *SLOTS, "dim", "dim_x", "dim_y", "target_source", "target_dim_y", "grid", "residual", "kriging", "time_dims"
)  # fmt: skip


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if (isinstance(value, dict) and isinstance(out.get(key), dict) and "name" not in value) or (
            isinstance(value, dict) and isinstance(out.get(key), dict) and value.get("name") == out[key].get("name")
        ):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Expand ``{"preset": name, **overrides}`` into a full specification; other specs pass through."""
    spec = {k: v for k, v in spec.items() if v is not None}
    name = spec.pop("preset", None)
    if name is None:
        return spec
    fn = get("model", name)
    names, _ = accepted_arguments(fn)
    preset_kwargs = {k: spec.pop(k) for k in list(spec) if k in names and k not in MODEL_KEYS}
    shared = {k: spec[k] for k in spec if k in names}
    return _deep_merge(fn(**preset_kwargs, **shared), spec)


def build_model(spec: dict[str, Any]) -> NeuralProcess:
    """A ``NeuralProcess`` from a specification (see the module docstring) or ``{"preset": ...}``."""
    return _build(spec)[0]


def expand_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The specification as built: the preset resolved, and every slot with all its arguments spelled out (what the
    recipe set, what the model passed in, and each default). Building the result gives the same model."""
    return _build(spec)[1]


def _build(spec: dict[str, Any]) -> tuple[NeuralProcess, dict[str, Any]]:
    """The model and its expanded specification."""
    spec = resolve_spec(spec)
    unknown = set(spec) - set(MODEL_KEYS)
    if unknown:
        raise ConfigError(
            f"model specification has unknown key(s) {sorted(unknown)}; allowed: {', '.join(MODEL_KEYS)}, preset."
        )
    missing = [s for s in SLOTS if s not in spec]
    if missing:
        raise ConfigError(f"model specification is missing slot(s) {missing}; every model fills {', '.join(SLOTS)}.")

    dim = int(spec.get("dim", 128))
    dim_x = int(spec.get("dim_x", 1))
    dim_y = spec.get("dim_y", 1)
    sources = {DEFAULT_SOURCE: int(dim_y)} if isinstance(dim_y, int) else {str(k): int(v) for k, v in dim_y.items()}
    sizes = {"dim": dim, "dim_x": dim_x, **{f"dim_y[{k!r}]": v for k, v in sources.items()}}
    bad = {k: v for k, v in sizes.items() if v < 1}
    if bad:
        raise ConfigError(f"model sizes must be >= 1; got {', '.join(f'{k} = {v}' for k, v in bad.items())}.")
    target_source = spec.get("target_source") or (next(iter(sources)) if len(sources) == 1 else None)
    if target_source not in sources:
        raise ConfigError(
            f"target_source must name one of the context sources {sorted(sources)} (its encoder embeds the "
            f"target locations); got {target_source!r}."
        )
    target_dim_y = int(spec.get("target_dim_y") or sources[target_source])
    time_dims = int(spec.get("time_dims") or 0)
    if not 0 <= time_dims < dim_x or (time_dims and spec.get("kriging") is not None):
        raise ConfigError(
            f"time_dims must be in 0..dim_x - 1 = {dim_x - 1} (the leading input dims that are times) and 0 with "
            f"kriging (a spatial layer); got {time_dims} with kriging {'set' if spec.get('kriging') else 'null'}."
        )
    try:
        grid = as_grid(spec.get("grid"))
    except ValueError as err:
        raise ConfigError(str(err)) from err
    expanded: dict[str, Any] = {
        "dim": dim,
        "dim_x": dim_x,
        "dim_y": dim_y,
        "target_source": target_source,
        "target_dim_y": target_dim_y,
        "grid": None if grid is None else grid.to_dict(),
        **({"time_dims": time_dims} if time_dims else {}),
    }

    # The settings the model shares with its components, by their ``SHARED`` name; each component is passed those of
    # ``SHARED[kind]`` (the ones its constructor accepts), so that table is the one statement of what it receives.
    settings: dict[str, Any] = {
        "dim": dim,
        "dim_x": dim_x,
        "dim_y": target_dim_y,
        "grid": grid,
        "sources": list(sources),
        "source_dims": sources,
    }

    def build(kind: str, slot_spec: dict[str, Any] | str, **own: Any) -> tuple[Any, dict[str, Any]]:
        """A component and its expanded spec (grids written as recipe mappings), given ``SHARED[kind]``'s settings
        (``own`` replaces some for this component)."""
        values = {**settings, **own}
        name, kwargs = spec_arguments(kind, slot_spec, **{key: values[key] for key in SHARED[kind]})
        if isinstance(kwargs.get("grid"), dict):  # a grid written out in a component's own spec
            kwargs["grid"] = as_grid(kwargs["grid"])
        full = with_defaults(kind, name, kwargs)
        return build_component(kind, name, **kwargs), {k: recipe_value(v) for k, v in full.items()}

    encoder_spec = spec["encoder"]
    per_source = isinstance(encoder_spec, dict) and "name" not in encoder_spec and set(encoder_spec) <= set(sources)
    encoders, encoder_specs = nn.ModuleDict(), {}
    for source, dy in sources.items():
        source_spec = encoder_spec[source] if per_source else encoder_spec
        encoders[source], encoder_specs[source] = build("encoder", source_spec, dim_y=dy)  # the Dy it embeds
    if per_source:
        expanded["encoder"] = encoder_specs
    else:  # one spec for every source: the sources' specs differ only in the dim_y the model passes to each
        expanded["encoder"] = {k: v for k, v in next(iter(encoder_specs.values())).items() if k != "dim_y"}
    wrong = {s: getattr(e, "dim_y", None) for s, e in encoders.items() if getattr(e, "dim_y", None) != sources[s]}
    if wrong:  # the model checks each source's y against its encoder's dim_y
        raise ConfigError(
            f"an encoder must keep the dim_y it embeds as its `dim_y` attribute; the encoders of {sorted(wrong)} have "
            f"{wrong} where the sources have {{{', '.join(f'{s!r}: {sources[s]}' for s in wrong)}}}."
        )
    widths = {getattr(e, "out_dim", dim) for e in encoders.values()}
    if len(widths) != 1:
        raise ConfigError(f"all sources' encoders must produce tokens of one width; got {sorted(widths)}.")
    settings["in_dim"] = widths.pop()
    settings["dim_x"] = dim_x - time_dims  # what follows the encoders sees the spatial dims only
    grid_encoder, expanded["grid_encoder"] = build("grid_encoder", spec["grid_encoder"])
    # A grid encoder may encode onto a coarser grid than the model's (``coarsen``): what follows works on that one.
    settings["grid"] = getattr(grid_encoder, "grid", None) or grid
    processor, expanded["processor"] = build("processor", spec["processor"])
    settings["layers"] = getattr(processor, "num_states", 1)
    grid_decoder, expanded["grid_decoder"] = build("grid_decoder", spec["grid_decoder"])
    likelihood, expanded["likelihood"] = build("likelihood", spec["likelihood"])
    residual = None
    if spec.get("residual") is not None:  # optional: the mean as a context interpolation plus the network's residual
        residual, expanded["residual"] = build("residual", spec["residual"])
    kriging = None
    if spec.get("kriging") is not None:  # optional: the predictive conditioned on one source's departures
        kriging, expanded["kriging"] = build("kriging", spec["kriging"])
    parts = (encoders, grid_encoder, processor, grid_decoder, likelihood)
    model = NeuralProcess(*parts, dim_x, target_source, grid, residual, kriging, time_dims)
    return model, expanded


def recipe_value(value: Any) -> Any:
    """A value as a recipe writes it: a ``Grid`` as its mapping, tuples as lists."""
    if isinstance(value, Grid):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [recipe_value(v) for v in value]
    return value


def create_model(name: str, **kwargs: Any) -> NeuralProcess:
    """A registered preset by name (timm-style): ``create_model("tnp", dim_x=1, dim_y=1)``."""
    return build_model({"preset": name, **kwargs})
