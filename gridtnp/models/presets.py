"""Named model presets: functions returning a five-slot specification (see ``build_model``).

Every preset takes ``dim_x``, ``dim_y`` and ``dim``; their meanings are documented once, in ``SHARED["model"]`` of
``gridtnp.registry``, and each preset's ``Args:`` lists only its own arguments.

``create_model("tnp")`` builds one; ``gridtnp list model --params`` prints their sizes. Recipes in
``recipes/`` spell the same specifications out in YAML.
"""

from __future__ import annotations

from typing import Any

from gridtnp.registry import register

Spec = dict[str, Any]


def _spec(encoder: Spec, grid_encoder: Spec, processor: Spec, grid_decoder: Spec, **shared: Any) -> Spec:
    return {
        "encoder": encoder,
        "grid_encoder": grid_encoder,
        "processor": processor,
        "grid_decoder": grid_decoder,
        "likelihood": {"name": "gaussian"},
        **shared,
    }


@register("model", "cnp")
def cnp(dim_x: int = 1, dim_y: int = 1, dim: int = 128) -> Spec:
    """CNP: MLP deep set, mean aggregation, MLP decoder on cat[x_t, r] (Garnelo et al. 2018)."""
    return _spec(
        {"name": "mlp", "layers": 3},
        {"name": "identity"},
        {"name": "mean"},
        {"name": "concat", "layers": 3},
        dim_x=dim_x,
        dim_y=dim_y,
        dim=dim,
    )


def _tnp_like(processor: Spec, dim_x: int, dim_y: int, dim: int) -> Spec:
    """MLP tokens, the context as a set, ``processor``, MHCA from the targets after each of its layers."""
    return _spec(
        {"name": "mlp"}, {"name": "identity"}, processor, {"name": "cross_attention"}, dim_x=dim_x, dim_y=dim_y, dim=dim
    )


@register("model", "tnp")
def tnp(dim_x: int = 1, dim_y: int = 1, dim: int = 128, layers: int = 5) -> Spec:
    """TNP: MHSA on the context, MHCA from context into targets after each layer (Nguyen & Grover 2022).

    Args:
        layers: context MHSA layers (each followed by a target MHCA block).
    """
    return _tnp_like({"name": "transformer", "layers": layers}, dim_x, dim_y, dim)


@register("model", "pt_tnp_ist")
def pt_tnp_ist(dim_x: int = 1, dim_y: int = 1, dim: int = 128, layers: int = 5, num_tokens: int = 128) -> Spec:
    """PT-TNP, IST style: U <- MHCA(U; Zc), zt <- MHCA(zt; U), Zc <- MHCA(Zc; U) per layer.

    Args:
        layers: pseudo-token layers (each followed by a target MHCA block).
        num_tokens: number of pseudo-tokens M.
    """
    return _tnp_like({"name": "ist", "layers": layers, "num_tokens": num_tokens}, dim_x, dim_y, dim)


@register("model", "pt_tnp_perceiver")
def pt_tnp_perceiver(dim_x: int = 1, dim_y: int = 1, dim: int = 128, layers: int = 5, num_tokens: int = 128) -> Spec:
    """PT-TNP, perceiver / LBANP style: U <- MHSA(MHCA(U; Zc)) per layer, targets read each U.

    Args:
        layers: pseudo-token layers (each followed by a target MHCA block).
        num_tokens: number of pseudo-tokens M.
    """
    return _tnp_like({"name": "perceiver", "layers": layers, "num_tokens": num_tokens}, dim_x, dim_y, dim)


@register("model", "convcnp")
def convcnp(
    dim_x: int = 1, dim_y: int = 1, dim: int = 128, grid_size: int | None = None, bound: float | None = None
) -> Spec:
    """ConvCNP (Gordon et al. 2020): SetConv with density channel, CNN (1-D) or U-Net (2-D+), SetConv decoder.

    Grid defaults: 128 points over [-4, 4] in 1-D; 32 per dimension over [-6, 6]^d otherwise.

    Args:
        grid_size: grid points per dimension; null for 128 in 1-D and 32 otherwise.
        bound: the grid spans ``[-bound, bound]`` in every dimension; null for 4 in 1-D and 6 otherwise.
    """
    size = grid_size or (128 if dim_x == 1 else 32)
    b = bound or (4.0 if dim_x == 1 else 6.0)
    return _spec(
        {"name": "identity"},
        {"name": "kernel_interpolation"},
        {"name": "cnn" if dim_x == 1 else "unet"},
        {"name": "kernel_interpolation"},
        dim_x=dim_x,
        dim_y=dim_y,
        dim=dim,
        grid={"lower": [-b] * dim_x, "upper": [b] * dim_x, "shape": [size] * dim_x},
    )


def _square_grid(dim_x: int, size: int, bound: float) -> Spec:
    return {"lower": [-bound] * dim_x, "upper": [bound] * dim_x, "shape": [size] * dim_x}


@register("model", "swin_tnp")
def swin_tnp(
    dim_x: int = 2,
    dim_y: int = 1,
    dim: int = 128,
    grid_encoder: str = "pseudo_token",
    grid_size: int = 32,
    bound: float = 6.0,
    window: int | None = None,
    layers: int = 5,
    decoder: str = "knn",
    k: int = 9,
) -> Spec:
    """Swin-TNP (gridded TNP paper): grid encoder onto a grid, Swin layers, k-NN target decoding per layer.

    ``decoder``: ``knn``, ``te_knn`` (translation-equivariant attention on the target-to-grid offsets) or any other
    grid decoder name. Window 4 up to 32 points per dimension, 8 above (the paper's 32 x 32 and 64 x 64 models).

    Args:
        grid_encoder: grid encoder name (e.g. ``pseudo_token``, ``kernel_interpolation``, ``average``), at its defaults.
        grid_size: grid points per dimension.
        bound: the grid spans ``[-bound, bound]`` in every dimension.
        window: Swin window in grid points per dimension; null for 4 up to ``grid_size`` 32 and 8 above.
        layers: Swin layers (each followed by a target block of the decoder).
        decoder: name of the grid decoder (``knn``, ``te_knn`` or any other), at its defaults.
        k: grid neighbours per target for ``knn`` and ``te_knn``; unused by other decoders.
    """
    decoder_spec: Spec = {"name": decoder, "k": k} if decoder in ("knn", "te_knn") else {"name": decoder}
    return _spec(
        {"name": "mlp"},
        {"name": grid_encoder},
        {"name": "swin", "layers": layers, "window": window or (4 if grid_size <= 32 else 8)},
        decoder_spec,
        dim_x=dim_x,
        dim_y=dim_y,
        dim=dim,
        grid=_square_grid(dim_x, grid_size, bound),
    )


@register("model", "vitnp")
def vitnp(
    dim_x: int = 2,
    dim_y: int = 1,
    dim: int = 128,
    grid_encoder: str = "pseudo_token",
    grid_size: int = 16,
    bound: float = 6.0,
    patch: int | None = None,
    layers: int = 5,
    k: int = 9,
) -> Spec:
    """ViTNP (gridded TNP paper): grid encoder, optional patch encoding, full MHSA, k-NN target decoding per layer.

    Args:
        grid_encoder: grid encoder name (e.g. ``pseudo_token``, ``kernel_interpolation``, ``average``), at its defaults.
        grid_size: grid points per dimension.
        bound: the grid spans ``[-bound, bound]`` in every dimension.
        patch: patch size of the ViT's patch encoding in grid points per dimension; null for no patches.
        layers: MHSA layers (each followed by a target k-NN block).
        k: grid neighbours per target of the k-NN decoder.
    """
    return _spec(
        {"name": "mlp"},
        {"name": grid_encoder},
        {"name": "vit", "layers": layers, "patch": patch},
        {"name": "knn", "k": k},
        dim_x=dim_x,
        dim_y=dim_y,
        dim=dim,
        grid=_square_grid(dim_x, grid_size, bound),
    )


def _te_like(processor: Spec, variant: str, rotation: bool, update_locations: bool, **shared: Any) -> Spec:
    """Value-only tokens, the context as a located set, a TE ``processor``, TE-MHCA into the targets per layer."""
    te = {"variant": variant, "rotation": rotation, "update_locations": update_locations}
    return _spec(
        {"name": "value"}, {"name": "identity"}, {**processor, **te}, {"name": "te_cross_attention", **te}, **shared
    )


@register("model", "te_tnp")
def te_tnp(
    dim_x: int = 1,
    dim_y: int = 1,
    dim: int = 128,
    layers: int = 5,
    variant: str = "post",
    rotation: bool = False,
    update_locations: bool = False,
) -> Spec:
    """TE-TNP (Ashman et al. 2024): value-only tokens, TE-MHSA on the context, TE-MHCA into the targets per layer.

    Args:
        layers: context TE-MHSA layers (each followed by a target TE-MHCA block).
        variant: TE attention variant, ``post`` or ``pre``.
        rotation: rotation-invariant attention (rho sees distances only).
        update_locations: update the locations in every block (eq. 10).
    """
    processor = {"name": "te_transformer", "layers": layers}
    return _te_like(processor, variant, rotation, update_locations, dim_x=dim_x, dim_y=dim_y, dim=dim)


@register("model", "te_pt_tnp")
def te_pt_tnp(
    dim_x: int = 1,
    dim_y: int = 1,
    dim: int = 128,
    layers: int = 5,
    num_tokens: int = 128,
    variant: str = "post",
    rotation: bool = False,
    update_locations: bool = False,
) -> Spec:
    """TE-PT-TNP: pseudo-tokens at pseudo-locations (eq. 11), TE-MHCA from the context and TE-MHSA per layer.

    Args:
        layers: pseudo-token layers (each followed by a target TE-MHCA block).
        num_tokens: number of pseudo-tokens M.
        variant: TE attention variant, ``post`` or ``pre``.
        rotation: rotation-invariant attention (rho sees distances only).
        update_locations: update the locations in every block (eq. 10).
    """
    processor = {"name": "te_perceiver", "layers": layers, "num_tokens": num_tokens}
    return _te_like(processor, variant, rotation, update_locations, dim_x=dim_x, dim_y=dim_y, dim=dim)


@register("model", "rcnp")
def rcnp(dim_x: int = 1, dim_y: int = 1, dim: int = 128, rotation: bool = False) -> Spec:
    """Simple RCNP (Huang et al. 2023): mean over the context of MLP(cat[x_t - x_n, nu(y_n)]), MLP decoder.

    Args:
        rotation: the MLP sees distances ``||x_t - x_n||`` only (rotation equivariant too).
    """
    return _spec(
        {"name": "value", "layers": 2},
        {"name": "identity"},
        {"name": "identity"},
        {"name": "relational", "rotation": rotation},
        dim_x=dim_x,
        dim_y=dim_y,
        dim=dim,
    )


@register("model", "msa")
def msa(dim_x: int = 1, dim_y: int = 1, dim: int = 128, layers: int = 5) -> Spec:
    """MSA: phi(x) + nu(y) context tokens, phi(x) target tokens, full MHSA over both together, MLP read-out.

    Args:
        layers: MHSA blocks over the context and target tokens together.
    """
    return _spec(
        {"name": "additive"},
        {"name": "identity"},
        {"name": "identity"},
        {"name": "joint_self_attention", "blocks": layers},
        dim_x=dim_x,
        dim_y=dim_y,
        dim=dim,
    )


@register("model", "tfs")
def tfs(dim_x: int = 1, dim_y: int = 1, dim: int = 128, layers: int = 3) -> Spec:
    """TFS: transformer encoder-decoder; MHSA over the context, then per layer target MHSA and MHCA to the context.

    Args:
        layers: context MHSA layers, and as many decoder layers (target MHSA, then MHCA to the final context).
    """
    return _spec(
        {"name": "additive"},
        {"name": "identity"},
        {"name": "transformer", "layers": layers},
        {"name": "transformer_decoder"},
        dim_x=dim_x,
        dim_y=dim_y,
        dim=dim,
    )


def _baseline(grid_decoder: Spec, dim_x: int, dim_y: int | dict[str, int]) -> Spec:
    """The context values as tokens, kept as a set, ``grid_decoder`` on them, affine map and constant variance."""
    widths = {dim_y} if isinstance(dim_y, int) else set(dim_y.values())
    if len(widths) != 1:
        raise ValueError(f"interpolation baselines need every source to have the same dim_y; got {dim_y}.")
    return {
        **_spec({"name": "identity"}, {"name": "identity"}, {"name": "identity"}, grid_decoder),
        "likelihood": {"name": "homoscedastic", "layers": 1},
        "dim_x": dim_x,
        "dim_y": dim_y,
        "dim": widths.pop(),  # the decoders then output the interpolant itself, no Linear
    }


@register("model", "interp")
def interp(dim_x: int = 2, dim_y: int | dict[str, int] = 1, k: int = 4, power: float = 2.0) -> Spec:
    """Learned linear-interpolation baseline: each source interpolated on its own, learned weights, constant variance.

    Scattered sources by inverse-distance weighting over their ``k`` nearest points; name gridded sources in the
    decoder's ``gridded`` for multilinear interpolation on their grid. The model's ``dim`` is the sources' ``dim_y``.

    Args:
        dim_y: output dimension, or ``{source: Dy}`` (all equal) for several sources.
        k: nearest points of a scattered source that each target's inverse-distance weighting uses.
        power: exponent of the inverse distance.
    """
    return _baseline({"name": "interpolation", "k": k, "power": power}, dim_x, dim_y)


@register("model", "gka")
def gka(dim_x: int = 2, dim_y: int | dict[str, int] = 1, lengthscale: float = 1.0, modulate: bool = False) -> Spec:
    """Gaussian kernel averaging over every context point with learned per-dimension length-scales.

    Args:
        dim_y: output dimension, or ``{source: Dy}`` (all equal) for several sources.
        lengthscale: starting length-scale in input units (learned per dimension).
        modulate: GKA-MLP: an MLP of the context location adds to each point's log-weight.
    """
    return _baseline({"name": "gka", "lengthscale": lengthscale, "modulate": modulate}, dim_x, dim_y)


@register("model", "gka_knn")
def gka_knn(
    dim_x: int = 2, dim_y: int | dict[str, int] = 1, lengthscale: float = 1.0, k: int = 16, modulate: bool = False
) -> Spec:
    """Gaussian kernel averaging over each target's ``k`` nearest context points (cell-list search).

    Args:
        dim_y: output dimension, or ``{source: Dy}`` (all equal) for several sources.
        lengthscale: starting length-scale in input units (learned per dimension).
        k: nearest context points (in the length-scale-scaled metric) each target averages over.
        modulate: GKA-MLP: an MLP of the context location adds to each point's log-weight.
    """
    return _baseline({"name": "gka", "lengthscale": lengthscale, "k": k, "modulate": modulate}, dim_x, dim_y)
