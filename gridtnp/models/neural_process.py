"""The five-slot neural process: encoder -> grid encoder -> processor -> grid decoder -> likelihood.

Every model in gridtnp, gridded or not, is this module with different components in the slots.
A specification is a plain mapping (what a YAML recipe holds)::

    {"dim_x": 1, "dim_y": 1, "dim": 128,
     "encoder": {"name": "mlp"}, "grid_encoder": {"name": "identity"},
     "processor": {"name": "transformer", "layers": 5},
     "grid_decoder": {"name": "cross_attention", "layers": 5}, "likelihood": {"name": "gaussian"}}

``build_model`` passes each component the shared keywords it accepts: ``dim``, ``dim_x``, ``dim_y``,
``grid`` (the model's coordinate system), ``in_dim`` and ``sources`` (width of the encoder's tokens and the
context source names, for grid encoders) and, for the grid decoder, ``layers`` (the processor's number of
states), ``in_dim`` and ``sources`` unless the spec sets them.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributions import Distribution, Normal

from gridtnp.batch import DEFAULT_SOURCE, Observations
from gridtnp.nn.grids import Grid, as_grid
from gridtnp.nn.kriging import Conditioned, ResidualKriging
from gridtnp.nn.residuals import Residual, shift_mean
from gridtnp.nn.tokens import Tokens
from gridtnp.registry import SHARED, ConfigError, accepted_arguments, get, spec_arguments, with_defaults
from gridtnp.registry import build as build_component

SLOTS = ("encoder", "grid_encoder", "processor", "grid_decoder", "likelihood")
MODEL_KEYS = (*SLOTS, "dim", "dim_x", "dim_y", "target_source", "target_dim_y", "grid", "residual", "kriging")


#: Most (target, context point) pairs per batch compared to find the context points that are also targets.
MATCH_PAIRS = 2**22  # the comparison holds [B, Nc, Nt, Dx] floats: 34 MB at Dx = 2

#: Target points (summed over tasks) decoded in one pass when predicting (``forward_chunked``).
TARGET_CHUNK = 2**16


class NeuralProcess(nn.Module):
    """Context ``{source: Observations}`` and target locations ``xt [B, Nt, Dx]`` -> ``p(y_t) [B, Nt, Dy]``."""

    def __init__(
        self,
        encoders: nn.ModuleDict,
        grid_encoder: nn.Module,
        processor: nn.Module,
        grid_decoder: nn.Module,
        likelihood: nn.Module,
        dim_x: int,
        target_source: str,
        grid: Grid | None = None,
        residual: Residual | None = None,
        kriging: ResidualKriging | None = None,
    ) -> None:
        super().__init__()
        self.encoders = encoders
        self.grid_encoder = grid_encoder
        self.processor = processor
        self.grid_decoder = grid_decoder
        self.likelihood = likelihood
        self.dim_x = dim_x
        self.target_source = target_source
        self.grid = grid
        self.residual = residual
        self.kriging = kriging

    def forward(self, context: dict[str, Observations], xt: Tensor) -> Distribution:
        """Predictive distribution at ``xt [B, Nt, Dx]`` given ``context`` (padded, masked sets)."""
        self._check_inputs(context, xt)
        encoded = self._encode(context)
        if self.kriging is None or getattr(self.grid_decoder, "targets_interact", False):
            return self._predict(encoded, self._condition(encoded), xt)  # the context points must not join targets
        # Each point is decoded on its own, so the network's predictive at the kriged source's context points comes
        # from the targets' decoding where every context point is also a target (a station task), else from one
        # decoder pass over the targets and the context points together.
        xc, _, valid = self._kriged_points(encoded)
        index = _target_at_each_point(xt, xc, valid)
        if index is not None:
            dist = gaussian(self._decode(*encoded, xt), "kriging")
            at_points = Normal(*(_rows(v, index) for v in (dist.mean, dist.stddev)))
            return self._predict(encoded, self._condition(encoded, at_points), xt, dist)
        dist = gaussian(self._decode(*encoded, torch.cat([xt, xc.to(xt.dtype)], 1)), "kriging")
        n = xt.shape[1]
        conditioned = self._condition(encoded, Normal(dist.mean[:, n:], dist.stddev[:, n:]))
        return self._predict(encoded, conditioned, xt, Normal(dist.mean[:, :n], dist.stddev[:, :n]))

    def forward_chunked(self, context: dict[str, Observations], xt: Tensor, chunk: int) -> Distribution:
        """``forward`` with the targets ``xt [B, Nt, Dx]`` decoded ``chunk`` at a time: the context is encoded and
        processed once, and memory grows with ``chunk`` rather than ``Nt`` (targets are conditionally independent
        given the context, so the result equals ``forward``'s). Needs a Gaussian predictive."""
        self._check_inputs(context, xt)
        encoded = self._encode(context)
        conditioned = self._condition(encoded)
        if xt.shape[1] <= chunk:
            return self._predict(encoded, conditioned, xt)
        means, stds = [], []
        for start in range(0, xt.shape[1], chunk):
            dist = gaussian(self._predict(encoded, conditioned, xt[:, start : start + chunk]), "forward_chunked")
            means.append(dist.mean)
            stds.append(dist.stddev)
        return Normal(torch.cat(means, 1), torch.cat(stds, 1))

    def _encode(self, context: dict[str, Observations]) -> tuple[Any, Any, Any]:
        """The context's tokens, its valid observations by source and the processor's states."""
        tokens, observed = {}, {}
        for name, obs in context.items():
            # Points with a NaN or inf in x or y are missing observations: masked out, and zeroed so that
            # no NaN reaches a matmul (0 * NaN would still be NaN).
            valid = obs.mask & torch.isfinite(obs.x).all(-1) & torch.isfinite(obs.y).all(-1)
            x = torch.where(valid.unsqueeze(-1), single(obs.x), 0.0)
            y = torch.where(valid.unsqueeze(-1), single(obs.y), 0.0)
            tokens[name] = Tokens(x, self.encoders[name](x, y), valid)
            observed[name] = (x, y, valid)
        latent = self.grid_encoder(tokens)
        return tokens, observed, self.processor(latent)

    def _kriged_points(self, encoded: tuple[Any, Any, Any]) -> tuple[Tensor, Tensor, Tensor]:
        """The kriged source's context ``(x, y, valid)``: an empty set where the context lacks that source."""
        observed = encoded[1]
        if self.kriging.source in observed:
            return observed[self.kriging.source]
        x, y, valid = next(iter(observed.values()))
        return x.new_zeros(x.shape[0], 0, x.shape[-1]), y.new_zeros(y.shape[0], 0, self.kriging.dim_y), valid[:, :0]

    def _condition(self, encoded: tuple[Any, Any, Any], at_points: Normal | None = None) -> Conditioned | None:
        """With ``kriging``: the context of the GP layer, from the network's predictive at the kriged source's points
        (``at_points``, decoded here unless given), factored once."""
        if self.kriging is None:
            return None
        xc, yc, valid = self._kriged_points(encoded)
        at_points = gaussian(self._decode(*encoded, xc) if at_points is None else at_points, "kriging")
        return self.kriging.condition(xc, yc, valid, at_points)

    def _predict(
        self,
        encoded: tuple[Any, Any, Any],
        conditioned: Conditioned | None,
        xt: Tensor,
        dist: Distribution | None = None,
    ) -> Distribution:
        """The predictive at ``xt [B, Nt, Dx]``: the network's (``dist``, decoded here unless given), kriged when the
        model has ``kriging``."""
        dist = self._decode(*encoded, xt) if dist is None else dist
        if conditioned is None:
            return dist
        return self.kriging(conditioned, finite_locations(xt), gaussian(dist, "kriging"))

    def _decode(self, tokens: Any, observed: Any, states: Any, xt: Tensor) -> Distribution:
        """The network's predictive at ``xt [B, Nt, Dx]`` from ``_encode``'s outputs."""
        # Padded target slots may hold anything; real targets with a non-finite location are refused where batches
        # are made (gridtnp.batch.Batch), without a device sync here.
        xt = finite_locations(xt)
        zt = self.encoders[self.target_source](xt, None)
        base = near = None
        if self.residual is not None:
            base, features, near = self.residual(observed, xt)
            zt = zt + self.residual.target_features(features).to(zt.dtype)
        if getattr(self.grid_decoder, "takes_context", False):  # a decoder with a skip connection from the context
            zt = self.grid_decoder(states, zt, xt, context=tokens)
        else:
            zt = self.grid_decoder(states, zt, xt)
        dist = self.likelihood(zt)
        if base is None:
            return dist
        if self.residual.adaptive:
            base = base + self.residual.adapt(near, zt)
        return shift_mean(dist, base, near.spread)

    def warn_outside_grid(self, context: dict[str, Observations], target: Observations) -> None:
        """Warn when targets or context lie beyond a gridded model's grid by more than half a cell: the model clamps
        such context into its edge cells and extrapolates to such targets. It syncs the device, so the prediction
        paths call it (``gridtnp predict``, ``gridtnp.predictions.predict``), not the training loop."""
        grid = self.grid
        if grid is None:
            return
        x0 = target.x
        lower, upper = x0.new_tensor(grid.lower), x0.new_tensor(grid.upper)
        margin, rolled = 0.5 * x0.new_tensor(grid.spacing), torch.tensor(grid.roll, device=x0.device)
        sets = [("targets", target), *((f"context {name!r}", obs) for name, obs in context.items())]
        for what, obs in sets:
            if obs.x.numel() == 0:
                continue
            inside = obs.mask.unsqueeze(-1) & torch.isfinite(obs.x)
            beyond = torch.maximum(
                torch.where(inside, lower - obs.x, 0.0).amax(dim=(0, 1)),
                torch.where(inside, obs.x - upper, 0.0).amax(dim=(0, 1)),
            )
            beyond = torch.where(rolled, 0.0, beyond)  # a rolled dimension (longitude) wraps: never outside
            if bool((beyond > margin).any()):
                d = int(beyond.argmax())
                warnings.warn(
                    f"{what} lie outside the model's grid along input dimension {d} by up to {float(beyond[d]):.4g} "
                    f"(grid [{grid.lower[d]}, {grid.upper[d]}]): the model extrapolates there.",
                    stacklevel=2,
                )

    def _check_inputs(self, context: dict[str, Observations], xt: Tensor) -> None:
        unknown = set(context) - set(self.encoders)
        if unknown:
            raise ValueError(
                f"context has source(s) {sorted(unknown)} that the model has no encoder for; "
                f"model sources: {sorted(self.encoders)}. Set the model's dim_y to a mapping {{source: Dy}}."
            )
        if xt.dim() != 3 or xt.shape[-1] != self.dim_x:
            raise ValueError(f"target x must be [B, Nt, Dx] with Dx = dim_x = {self.dim_x}; got {tuple(xt.shape)}.")
        for name, obs in context.items():
            if obs.x.shape[-1] != self.dim_x:
                raise ValueError(
                    f"context[{name!r}].x has Dx = {obs.x.shape[-1]} but the model was built with dim_x = {self.dim_x}."
                )
            dim_y = self.encoders[name].dim_y
            if obs.y is None or obs.y.shape[-1] != dim_y:
                got = None if obs.y is None else tuple(obs.y.shape)
                raise ValueError(f"context[{name!r}].y must be [B, N, {dim_y}] for this model; got {got}.")
            if obs.x.shape[0] != xt.shape[0]:
                raise ValueError(f"context[{name!r}] has batch size {obs.x.shape[0]} but target x has {xt.shape[0]}.")


def _target_at_each_point(xt: Tensor, xc: Tensor, valid: Tensor) -> Tensor | None:
    """Indices ``[B, Nc]`` of a target slot of ``xt [B, Nt, Dx]`` at each valid point of ``xc [B, Nc, Dx]`` (to
    float32 rounding), or None where some valid point has none or the sets are too large to compare pairwise (above
    ``MATCH_PAIRS`` pairs per batch; one device sync)."""
    if xt.shape[1] == 0 or xc.shape[1] == 0 or xt.shape[0] * xt.shape[1] * xc.shape[1] > MATCH_PAIRS:
        return None
    xt, xc = torch.nan_to_num(xt.detach().float()), xc.detach().float()
    tolerance = 1e-6 * (1.0 + xc.abs().amax(-1, keepdim=True))  # [B, Nc, 1]
    same = (xc.unsqueeze(2) - xt.unsqueeze(1)).abs().amax(-1) <= tolerance  # [B, Nc, Nt]
    if not bool((same.any(-1) | ~valid).all()):
        return None
    return same.to(torch.uint8).argmax(-1)  # the first target at each point


def _rows(values: Tensor, index: Tensor) -> Tensor:
    """``values [B, N, D]`` at the rows ``index [B, M]`` -> ``[B, M, D]``."""
    return torch.gather(values, 1, index.unsqueeze(-1).expand(-1, -1, values.shape[-1]))


def gaussian(dist: Distribution, what: str) -> Normal:
    """``dist``, checked to be the Normal that ``what`` needs."""
    if not isinstance(dist, Normal):
        raise TypeError(f"{what} needs a Gaussian likelihood (a Normal predictive); got {type(dist).__name__}.")
    return dist


def finite_locations(xt: Tensor) -> Tensor:
    """Target locations ``[B, Nt, Dx]`` in float32 (``single``) with padded slots' non-finite values set to 0."""
    return torch.nan_to_num(single(xt), nan=0.0, posinf=0.0, neginf=0.0)


def single(t: Tensor) -> Tensor:
    """float64 inputs (numpy's default) as float32, the precision the models compute in; other tensors unchanged."""
    return t.float() if t.dtype == torch.float64 else t


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
    model = NeuralProcess(
        encoders, grid_encoder, processor, grid_decoder, likelihood, dim_x, target_source, grid, residual, kriging
    )
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


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
