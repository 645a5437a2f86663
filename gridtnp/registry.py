"""A small string registry for every component kind (timm-style).

>>> @register("processor", "swin")
... class SwinProcessor(nn.Module): ...
>>> build("processor", "swin", dim=128)
>>> available("processor")
['cnn', 'swin', ...]

Recipes name components by these strings; ``build`` checks keyword arguments against the
component's signature so a typo in a recipe key fails with the list of accepted keys.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

KINDS: dict[str, str] = {
    "encoder": "point-wise encoder: (x, y) at each observation -> token",
    "grid_encoder": "tokens at arbitrary locations -> pseudo-tokens (a grid or a set)",
    "processor": "works on the pseudo-tokens, one state per layer",
    "grid_decoder": "pseudo-token states + target locations -> target tokens",
    "likelihood": "target tokens -> predictive distribution",
    "embedding": "input-location embedding used by point-wise encoders",
    "model": "named presets: a whole five-slot model specification",
    "task": "synthetic task generators for SyntheticDataModule",
    "datamodule": "LightningDataModules",
}

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}

# Modules that register components of a kind but are too heavy to import with gridtnp (xarray, dask):
# imported the first time that kind is looked up, so `gridtnp list datamodule` shows them too.
_LAZY_MODULES: dict[str, list[str]] = {"datamodule": ["gridtnp.data.era5"]}

T = TypeVar("T", bound=Callable[..., Any])


class ConfigError(ValueError):
    """A recipe or component specification that cannot be built; the message says how to fix it."""


def _check_kind(kind: str, load: bool = True) -> dict[str, Callable[..., Any]]:
    if kind not in _REGISTRY:
        raise ConfigError(f"Unknown component kind {kind!r}. Kinds: {', '.join(KINDS)}.")
    if load:
        while _LAZY_MODULES.get(kind):
            importlib.import_module(_LAZY_MODULES[kind].pop())
    return _REGISTRY[kind]


def register(kind: str, name: str) -> Callable[[T], T]:
    """Decorator: register a class or factory function under ``kind``/``name``."""
    table = _check_kind(kind, load=False)

    def decorator(obj: T) -> T:
        if name in table and table[name] is not obj:
            raise ConfigError(f"{kind} {name!r} is already registered by {table[name]!r}.")
        table[name] = obj
        obj.registry_name = name  # type: ignore[attr-defined]
        return obj

    return decorator


def available(kind: str | None = None) -> list[str] | dict[str, list[str]]:
    """Sorted registered names of one kind, or a ``{kind: names}`` dict of all kinds."""
    if kind is None:
        return {k: sorted(_check_kind(k)) for k in _REGISTRY}
    return sorted(_check_kind(kind))


def get(kind: str, name: str) -> Callable[..., Any]:
    """The registered class or factory; unknown names fail with close matches and the full list."""
    table = _check_kind(kind)
    if name not in table:
        close = difflib.get_close_matches(str(name), table, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"Unknown {kind} {name!r}.{hint} Available {kind}s: {', '.join(sorted(table)) or '(none)'}.")
    return table[name]


def accepted_arguments(fn: Callable[..., Any]) -> tuple[set[str], bool]:
    """Keyword names ``fn`` accepts, and whether it also takes ``**kwargs``."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    if target is object.__init__ or getattr(target, "__qualname__", "") == "Module.__init__":
        return set(), False  # a class without its own __init__ takes no arguments
    params = list(inspect.signature(target).parameters.values())
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    names.discard("self")
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def build(kind: str, name: str, /, **kwargs: Any) -> Any:
    """Instantiate ``kind``/``name`` with ``kwargs``; unknown keys fail with the accepted ones."""
    fn = get(kind, name)
    names, var_kw = accepted_arguments(fn)
    unknown = sorted(set(kwargs) - names) if not var_kw else []
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(
            f"{kind} {name!r} got unknown argument(s) {', '.join(hints)}. Accepted: {', '.join(sorted(names))}."
        )
    try:
        return fn(**kwargs)
    except ConfigError:
        raise
    except TypeError as err:  # a missing required argument, say
        raise ConfigError(f"Cannot build {kind} {name!r}: {err}") from err
    except ValueError as err:  # a component rejecting a value: its message says what is allowed
        raise ConfigError(str(err) if name in str(err) else f"{kind} {name!r}: {err}") from err


def build_from_spec(kind: str, spec: dict[str, Any] | str, /, **shared: Any) -> Any:
    """Build from ``{"name": ..., **kwargs}`` (or a bare name), adding the ``shared`` keywords
    the component accepts (``dim``, ``dim_x``, ...) unless the spec sets them itself."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(
            f"A {kind} is specified as a mapping with a 'name' key, e.g. {{name: ..., ...}}; got {spec!r}. "
            f"Available {kind}s: {', '.join(available(kind))}."  # type: ignore[arg-type]
        )
    kwargs = dict(spec)
    name = kwargs.pop("name")
    names, var_kw = accepted_arguments(get(kind, name))
    for key, value in shared.items():
        if key not in kwargs and (key in names or var_kw):
            kwargs[key] = value
    return build(kind, name, **kwargs)


def describe(kind: str, name: str) -> str:
    """First line of the component's docstring, without reStructuredText literal markup."""
    doc = inspect.getdoc(get(kind, name)) or ""
    return doc.splitlines()[0].replace("``", "") if doc else ""
