"""Credentials in text and structures: passwords in addresses, secrets in YAML comments, AWS key ids."""

from __future__ import annotations

from jsonargparse import Namespace

from gridtnp.redaction import REDACTED, redact, redact_text, redact_url


def test_a_password_in_an_address_is_replaced_wherever_it_appears():
    assert redact_url("http://user:PW@host:8080/a.zarr") == "http://user:***@host:8080/a.zarr"
    assert redact_url("prepare s3://k:s@b/x.nc --out o") == "prepare s3://k:***@b/x.nc --out o"
    assert redact_url("http://host/a@b.zarr and user@example.org") == "http://host/a@b.zarr and user@example.org"
    config = Namespace(data=Namespace(store="https://u:p%40ss@h/era5.zarr", sources=["ftp://a:b@c/d"]))
    clean = redact(config)
    assert clean.data.store == "https://u:***@h/era5.zarr" and clean.data.sources == ["ftp://a:***@c/d"]
    assert config.data.store == "https://u:p%40ss@h/era5.zarr"  # the run's own config is untouched


def test_a_recipe_keeps_its_comments_but_not_the_secrets_in_them():
    text = "# token: abc123, id AKIAABCDEFGHIJKLMNOP\nmodel:\n  lr: 0.001  # password = 'hunter2'\n  dim: 8 # kept\n"
    clean = redact_text(text)
    assert "abc123" not in clean and "AKIA" not in clean and "hunter2" not in clean
    assert "# kept" in clean and "lr: 0.001" in clean and clean.count(REDACTED) == 3
    assert redact_text("a: 1  # kept\n") == "a: 1  # kept\n"


def test_a_recipe_with_a_credential_in_its_values_is_written_without_it():
    text = "# secret: s1\ndata:\n  store: http://u:s2@h/x.zarr\n  storage_options: {key: s3, secret: s4}\n"
    clean = redact_text(text)
    assert not any(s in clean for s in ("s1", ":s2@", "s3", "s4")) and "http://u:***@h/x.zarr" in clean
