"""Location embeddings: spherical harmonics against closed forms and quadrature, temporal precision, composite."""

import math

import numpy as np
import pytest
import torch

from gridtnp.batch import Observations
from gridtnp.models import build_model
from gridtnp.registry import available, build

L = 10


def sh(**kwargs):
    return build("embedding", "spherical_harmonics", **{"dim_x": 2, **kwargs})


def lat_lon(n: int = 500) -> torch.Tensor:
    """Random (lat, lon) in degrees, ``[1, n, 2]``."""
    return torch.stack([torch.rand(n) * 180 - 90, torch.rand(n) * 720 - 360], -1).unsqueeze(0)


def test_registered():
    assert {"spherical_harmonics", "temporal", "composite"} <= set(available("embedding"))


def test_low_degrees_match_closed_forms():
    x = lat_lon()
    lat, lon = torch.deg2rad(x[..., 0]), torch.deg2rad(x[..., 1])
    features = sh()(x)
    assert features.shape == (1, 500, L * L) and features.dtype == torch.float32
    k0, k1 = 1 / math.sqrt(4 * math.pi), math.sqrt(3 / (4 * math.pi))
    # Order within degree l: m = -l .. l.
    expected = [
        torch.full_like(lat, k0),  # Y_0^0
        k1 * lat.cos() * lon.sin(),  # Y_1^-1
        k1 * lat.sin(),  # Y_1^0 = cos(colatitude)
        k1 * lat.cos() * lon.cos(),  # Y_1^1
        math.sqrt(5 / (16 * math.pi)) * (3 * lat.sin() ** 2 - 1),  # Y_2^0
        math.sqrt(15 / (16 * math.pi)) * lat.cos() ** 2 * (2 * lon).cos(),  # Y_2^2
    ]
    got = [features[..., i] for i in (0, 1, 2, 3, 6, 8)]
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_all_degrees_match_scipy():
    special = pytest.importorskip("scipy.special")
    if not hasattr(special, "sph_harm_y"):
        pytest.skip("scipy >= 1.15 needed for sph_harm_y")
    x = lat_lon(200)
    colat = torch.deg2rad(90 - x[0, :, 0]).double().numpy()
    lon = torch.deg2rad(x[0, :, 1]).double().numpy()
    ref = []
    for ell in range(L):
        for m in range(-ell, ell + 1):
            y = special.sph_harm_y(ell, abs(m), colat, lon) * (-1) ** abs(m)  # scipy has the Condon-Shortley phase
            ref.append(y.real if m == 0 else math.sqrt(2) * (y.real if m > 0 else y.imag))
    ref = torch.from_numpy(np.stack(ref, -1)).float()
    torch.testing.assert_close(sh()(x)[0], ref, atol=2e-5, rtol=1e-4)


def test_orthonormal_on_quadrature_grid():
    # Gauss-Legendre in mu = sin(lat) and uniform longitudes integrate every product Y_l^m Y_l'^m' (l, l' < L)
    # exactly, so the Gram matrix is the identity up to float32 rounding of the features.
    mu, w_mu = np.polynomial.legendre.leggauss(2 * L)
    n_lon = 4 * L
    lat = torch.rad2deg(torch.asin(torch.from_numpy(mu)))
    lon = torch.arange(n_lon, dtype=torch.float64) * (360 / n_lon)
    grid = torch.stack(torch.meshgrid(lat, lon, indexing="ij"), -1).reshape(1, -1, 2)
    features = sh()(grid.float())[0].double()
    weights = torch.from_numpy(w_mu).repeat_interleave(n_lon) * (2 * math.pi / n_lon)
    gram = features.T @ (features * weights[:, None])
    torch.testing.assert_close(gram, torch.eye(L * L, dtype=torch.float64), atol=1e-5, rtol=0)
    # A fine midpoint grid in latitude (the plain lat/lon quadrature) agrees to its own accuracy.
    n_lat = 180
    lat = (torch.arange(n_lat, dtype=torch.float64) + 0.5) * (180 / n_lat) - 90
    grid = torch.stack(torch.meshgrid(lat, lon, indexing="ij"), -1).reshape(1, -1, 2)
    features = sh()(grid.float())[0].double()
    weights = torch.deg2rad(lat).cos().repeat_interleave(n_lon) * (math.pi / n_lat) * (2 * math.pi / n_lon)
    gram = features.T @ (features * weights[:, None])
    torch.testing.assert_close(gram, torch.eye(L * L, dtype=torch.float64), atol=2e-3, rtol=0)


def test_longitude_periodicity_and_poles():
    embed = sh()
    x = lat_lon()
    # Integer-valued longitudes: lon + 360 is exact in float32, so the features are identical.
    x[..., 1] = x[..., 1].round()
    shifted = x.clone()
    shifted[..., 1] += 360
    assert torch.equal(embed(shifted), embed(x))
    shifted[..., 1] -= 720
    assert torch.equal(embed(shifted), embed(x))
    # At a pole every longitude is the same point: only m = 0 terms survive and they agree.
    poles = torch.tensor([[[90.0, 0.0], [90.0, 123.0], [-90.0, -45.0], [-90.0, 300.0]]])
    f = embed(poles)[0]
    torch.testing.assert_close(f[0], f[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(f[2], f[3], atol=1e-6, rtol=0)
    assert torch.isfinite(f).all()


def test_spherical_harmonics_pass_through_and_dims():
    x = torch.cat([torch.randn(2, 7, 1), lat_lon(14).reshape(2, 7, 2)], -1)  # (time, lat, lon)
    embed = sh(dim_x=3)
    out = embed(x)
    assert embed.out_dim == 1 + L * L and out.shape == (2, 7, 1 + L * L)
    torch.testing.assert_close(out[..., :1], x[..., :1])
    torch.testing.assert_close(out[..., 1:], sh()(x[..., 1:]))
    swapped = sh(dim_x=3, lat_lon_dims=(2, 1))(x[..., [0, 2, 1]])
    torch.testing.assert_close(swapped, out)
    assert sh(legendre_polynomials=3).out_dim == 9
    with pytest.raises(ValueError, match="lat_lon_dims"):
        sh(lat_lon_dims=(0, 0))
    with pytest.raises(ValueError, match="dim_x >= 2"):
        sh(dim_x=1)


def test_temporal_periodicity():
    embed = build("embedding", "temporal", dim_x=1, wavelengths=[24.0, 8760.0])
    t = torch.rand(1, 50, 1, dtype=torch.float64) * 5e5
    out = embed(t)
    assert out.shape == (1, 50, 4) and embed.out_dim == 4
    torch.testing.assert_close(embed(t + 24)[..., [0, 2]], out[..., [0, 2]], atol=1e-9, rtol=0)
    torch.testing.assert_close(embed(t + 8760)[..., [1, 3]], out[..., [1, 3]], atol=1e-9, rtol=0)
    torch.testing.assert_close(out[..., 0], torch.sin(2 * math.pi * t[..., 0] / 24))
    # The default log-spaced wavelengths run from 1 h to 8,760 h, both included.
    default = build("embedding", "temporal", dim_x=1)
    torch.testing.assert_close(default.wavelengths[[0, -1]], torch.tensor([1.0, 8760.0], dtype=torch.float64))
    assert default.out_dim == 32


def test_temporal_float32_keeps_the_hour():
    embed = build("embedding", "temporal", dim_x=1, wavelengths=[1.0, 3.0, 24.0])
    t = torch.tensor([[[460_000.0], [460_001.0], [460_000.5]]])  # float32, ~2022
    out = embed(t)[0]
    assert out.dtype == torch.float32
    # 1 h wavelength: whole hours are phase 0 exactly; half an hour is phase pi.
    torch.testing.assert_close(out[:2, 0], torch.zeros(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(out[:2, 3], torch.ones(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(out[2, 3], torch.tensor(-1.0), atol=1e-6, rtol=0)
    # 24 h wavelength: one hour later is 15 degrees further round the diurnal cycle.
    phase = 2 * math.pi * (460_000 % 24) / 24
    step = 2 * math.pi / 24
    torch.testing.assert_close(out[0, [2, 5]], torch.tensor([math.sin(phase), math.cos(phase)]), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        out[1, [2, 5]], torch.tensor([math.sin(phase + step), math.cos(phase + step)]), atol=1e-6, rtol=0
    )
    # A naive float32 phase is visibly wrong at this magnitude; the embedding is not.
    naive = torch.sin(2 * math.pi * t[0, 0, 0] / 3.0)
    exact = math.sin(2 * math.pi * (460_000 % 3) / 3)
    assert abs(out[0, 1].item() - exact) < 1e-6 and abs(naive.item() - exact) > 1e-3


def test_temporal_time_dim_and_pass_through():
    embed = build("embedding", "temporal", dim_x=3, time_dim=1, num_wavelengths=4)
    x = torch.randn(2, 5, 3)
    out = embed(x)
    assert out.shape == (2, 5, 2 + 8)
    torch.testing.assert_close(out[..., :2], x[..., [0, 2]])
    with pytest.raises(ValueError, match="time_dim"):
        build("embedding", "temporal", dim_x=1, time_dim=1)


def test_composite_shapes_and_parts():
    spec = [{"name": "temporal", "dims": [0]}, {"name": "spherical_harmonics", "dims": [1, 2]}]
    embed = build("embedding", "composite", dim_x=3, parts=spec)
    x = torch.cat([torch.rand(4, 6, 1) * 5e5, lat_lon(24).reshape(4, 6, 2)], -1)
    out = embed(x)
    assert embed.out_dim == 32 + L * L and out.shape == (4, 6, 32 + L * L)
    torch.testing.assert_close(out[..., 32:], sh()(x[..., 1:]))
    parts = [{"name": "identity", "dims": [1, 0]}, {"name": "fourier", "dims": [0]}]
    mixed = build("embedding", "composite", dim_x=2, parts=parts)
    y = torch.randn(2, 3, 2)
    assert mixed.out_dim == 2 + 33
    torch.testing.assert_close(mixed(y)[..., :2], y[..., [1, 0]])


def test_composite_errors_are_actionable():
    with pytest.raises(ValueError, match=r"identity, dims: \[2\]"):
        build("embedding", "composite", dim_x=3, parts=[{"name": "spherical_harmonics", "dims": [0, 1]}])
    with pytest.raises(ValueError, match="'name' and 'dims'"):
        build("embedding", "composite", dim_x=1, parts=[{"name": "fourier"}])
    with pytest.raises(ValueError, match="dims"):
        build("embedding", "composite", dim_x=1, parts=[{"name": "fourier", "dims": [3]}])
    with pytest.raises(ValueError, match="non-empty list"):
        build("embedding", "composite", dim_x=1, parts=[])


def test_composite_in_an_encoder_trains():
    embed = {
        "name": "composite",
        "parts": [{"name": "temporal", "dims": [0]}, {"name": "spherical_harmonics", "dims": [1, 2]}],
    }
    model = build_model({"preset": "cnp", "dim_x": 3, "dim": 16, "encoder": {"embed": embed}})
    x = torch.cat([torch.rand(2, 8, 1) * 5e5, lat_lon(16).reshape(2, 8, 2)], -1)
    dist = model({"points": Observations(x, torch.randn(2, 8, 1))}, x[:, :3])
    dist.log_prob(torch.zeros_like(dist.mean)).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_casting_the_module_keeps_full_precision_constants():
    # Module.float() / .half() cast float64 buffers too; the embeddings rebuild their constants instead.
    temporal = build("embedding", "temporal", dim_x=1)
    t = torch.tensor([[[460_000.0], [460_123.5]]])
    expected = temporal(t)
    torch.testing.assert_close(temporal.float()(t), expected, atol=1e-6, rtol=0)
    embed = sh()
    x = lat_lon(50)
    torch.testing.assert_close(embed.half()(x), sh()(x), atol=1e-6, rtol=0)
    assert embed.half()(x.double()).dtype == torch.float64
