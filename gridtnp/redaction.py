"""Credentials kept out of every output: saved configs, checkpoints' hyper-parameters, logger folders, predictions.

A value is a credential when it sits anywhere under a ``storage_options`` entry (fsspec options: tokens, keys,
profiles), or when it is a string under a key named like ``token``, ``key``, ``secret``, ``password`` or
``credentials`` (``api_key``, ``client_secret``, ...). Such values are written as ``REDACTED``. A password inside
an address (``http://user:PW@host/...``) is written as ``***``, wherever the address appears.

* ``redact(value)``: a copy of a nested mapping / list structure (dicts, jsonargparse ``Namespace``) with
  credentials replaced.
* ``redact_text(text)``: a YAML document (a recipe) with credentials replaced, in its comments too; the text itself
  when it holds none.
* ``redact_url(text)``: ``text`` with the password of every address in it replaced.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

REDACTED = "REDACTED"
CREDENTIAL_KEY = re.compile(r"(^|_)(token|key|secret|password|passwd|credentials?)$", re.IGNORECASE)
CREDENTIAL_BRANCH = "storage_options"
URL_PASSWORD = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^/\s:@]*:)[^/\s@]+@")
# In free text (a YAML comment): ``<credential key>: value`` / ``= value``, and AWS access key ids.
TEXT_CREDENTIAL = re.compile(
    r"((?:\w*_)?(?:token|key|secret|password|passwd|credentials?)\b['\"]?\s*[:=]\s*)(['\"]?)[^\s'\",}]+",
    re.IGNORECASE,
)
AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")


def is_credential_key(key: Any) -> bool:
    """Whether a string value under ``key`` is a credential."""
    return isinstance(key, str) and bool(CREDENTIAL_KEY.search(key))


def redact(value: Any, inside: bool = False) -> Any:
    """A copy of ``value`` with every credential replaced by ``REDACTED`` (``inside``: under ``storage_options``)."""
    from jsonargparse import Namespace

    if isinstance(value, Namespace):
        return Namespace(**{k: _entry(k, v, inside) for k, v in vars(value).items()})
    if isinstance(value, Mapping):
        out = {k: _entry(k, v, inside) for k, v in value.items()}
        return type(value)(out) if type(value) is not dict and _rebuildable(value) else out
    if isinstance(value, list | tuple):
        return type(value)(redact(v, inside) for v in value)
    if inside and value is not None and not isinstance(value, bool):
        return REDACTED
    if isinstance(value, str):
        return redact_url(value)
    return value


def redact_url(text: str) -> str:
    """``text`` with the password of every address in it (``scheme://user:PW@host``) replaced by ``***``."""
    return URL_PASSWORD.sub(r"\1***@", text) if "@" in text else text


def _entry(key: Any, value: Any, inside: bool) -> Any:
    if key == CREDENTIAL_BRANCH:
        return redact(value, inside=True)
    if isinstance(value, str) and (inside or is_credential_key(key)):
        return REDACTED
    return redact(value, inside)


def _rebuildable(value: Mapping) -> bool:
    try:
        type(value)({})
    except Exception:
        return False
    return True


def redact_text(text: str) -> str:
    """A YAML document with its credentials replaced, comments included; unchanged when it holds none."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        return _redact_free_text(text)
    cleaned = redact(document)
    if cleaned == document:
        return "".join(_redact_comment(line) for line in text.splitlines(keepends=True))
    return yaml.safe_dump(cleaned, sort_keys=False)


def _redact_comment(line: str) -> str:
    """``line`` with credentials in its ``# comment`` replaced (the YAML before it holds none)."""
    start = line.find("#")
    if start < 0:
        return line
    return line[:start] + _redact_free_text(line[start:])


def _redact_free_text(text: str) -> str:
    text = TEXT_CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return redact_url(AWS_KEY_ID.sub(REDACTED, text))
