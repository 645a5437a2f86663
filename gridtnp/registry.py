"""A small string registry for every component kind (timm-style).

>>> @register("processor", "swin")
... class SwinProcessor(nn.Module): ...
>>> build("processor", "swin", dim=128)
>>> available("processor")
['cnn', 'swin', ...]

Recipes name components by these strings; ``build`` checks keyword arguments against the
component's signature so a typo in a recipe key fails with the list of accepted keys.

Discovery: a package registers what it defines when it is imported (``@register`` at each definition, the
package's ``__init__`` importing its modules). The registry itself imports nothing of gridtnp: on the first lookup it
calls the loaders added with ``add_loader`` (``gridtnp/__init__`` adds the one that imports gridtnp's own
component packages) and then loads every Python entry point of the group ``gridtnp.components`` (a plugin package's
``[project.entry-points."gridtnp.components"]``, see docs/extending.md), once.

Shared settings: the model passes each component the settings of ``SHARED[kind]`` that its constructor accepts
(``dim``, ``grid``, ...), unless the recipe sets them itself. ``document(kind, name)`` (``gridtnp list KIND NAME``)
shows a component's docstring, its arguments with types, defaults and meanings (from the ``Args:`` section of its
docstring, or ``SHARED``), and which of them the model passes in.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import docstring_parser

KINDS: dict[str, str] = {
    "encoder": "point-wise encoder: (x, y) at each observation -> token",
    "grid_encoder": "tokens at arbitrary locations -> pseudo-tokens (a grid or a set)",
    "processor": "works on the pseudo-tokens, one state per layer",
    "grid_decoder": "pseudo-token states + target locations -> target tokens",
    "likelihood": "target tokens -> predictive distribution (a torch Normal: metrics and residuals read mean, std)",
    "residual": "optional: the predictive mean as an interpolation of context values plus the network's residual",
    "kriging": "optional: the predictive conditioned on one source's departures by a closed-form GP layer",
    "embedding": "input-location embedding used by point-wise encoders",
    "model": "named presets: a whole five-slot model specification",
    "task": "synthetic task generators for SyntheticDataModule",
    "datamodule": "LightningDataModules (a recipe's data.class_path may name one: class_path: era5_stations)",
}

#: What the model passes to each kind of component (when its constructor accepts it), and what it means.
SHARED: dict[str, dict[str, str]] = {
    "encoder": {
        "dim": "token width D (the model's dim)",
        "dim_x": "input dimension Dx (the model's dim_x)",
        "dim_y": "output dimension Dy of the context source this encoder embeds",
        "grid": "the model's grid",
    },
    "grid_encoder": {
        "dim": "token width D (the model's dim)",
        "dim_x": "input dimension Dx (the model's dim_x)",
        "grid": "the model's grid",
        "in_dim": "width of the point-wise encoders' tokens",
        "sources": "names of the context sources",
    },
    "processor": {
        "dim": "token width D (the model's dim)",
        "dim_x": "input dimension Dx (the model's dim_x)",
        "grid": "the grid the grid encoder writes to",
    },
    "grid_decoder": {
        "dim": "token width D (the model's dim)",
        "dim_x": "input dimension Dx (the model's dim_x)",
        "grid": "the grid the grid encoder writes to",
        "layers": "blocks, one per processor state read (the model passes the processor's number of states)",
        "in_dim": "width of the point-wise encoders' tokens",
        "sources": "names of the context sources",
    },
    "likelihood": {"dim": "token width D (the model's dim)", "dim_y": "output dimension Dy of the targets"},
    "residual": {
        "dim": "token width D (the model's dim)",
        "dim_x": "input dimension Dx (the model's dim_x)",
        "dim_y": "output dimension Dy of the targets",
        "source_dims": "{source: Dy} of the model's context sources",
    },
    "kriging": {
        "dim_x": "input dimension Dx (the model's dim_x)",
        "dim_y": "output dimension Dy of the targets",
        "source_dims": "{source: Dy} of the model's context sources",
    },
    "embedding": {"dim_x": "input dimension Dx (from the encoder)"},
    "model": {"dim_x": "input dimension Dx", "dim_y": "output dimension Dy", "dim": "token width D"},
    "task": {},
    "datamodule": {},
}

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}

#: The entry-point group through which installed packages add components (each entry point names a module to import).
ENTRY_POINT_GROUP = "gridtnp.components"

# Functions that import modules registering components, run once before the first lookup (``add_loader``).
_loaders: list[Callable[[], object]] = []
_loaded = False

T = TypeVar("T", bound=Callable[..., Any])


class ConfigError(ValueError):
    """A recipe or component specification that cannot be built; the message says how to fix it."""


def add_loader(loader: Callable[[], object]) -> None:
    """Run ``loader`` (a function importing modules that register components) before the first lookup, or now if a
    lookup has already happened."""
    if _loaded:
        loader()
    else:
        _loaders.append(loader)


def load_plugins() -> None:
    """Run the added loaders and import the modules of every ``gridtnp.components`` entry point (once).

    A plugin that fails to import is skipped with a warning naming its entry point, so one broken package does not
    hide the others' components.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True  # before importing: a module that looks a component up while it registers must not reenter
    try:
        while _loaders:
            _loaders[0]()
            _loaders.pop(0)
    except BaseException:
        _loaded = False  # gridtnp's own modules failed to import: every lookup says so, none sees half a registry
        raise
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as err:  # a third-party package: report it, keep the rest usable
            warnings.warn(
                f"gridtnp plugin {entry.name!r} ({entry.value}, entry point group {ENTRY_POINT_GROUP!r}) failed to "
                f"import and is skipped: {type(err).__name__}: {err}",
                stacklevel=2,
            )


def _check_kind(kind: str, load: bool = True) -> dict[str, Callable[..., Any]]:
    if kind not in _REGISTRY:
        raise ConfigError(f"Unknown component kind {kind!r}. Kinds: {', '.join(KINDS)}.")
    if load:
        load_plugins()
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


def unregister(kind: str, name: str) -> Callable[..., Any]:
    """Remove ``kind``/``name`` from the registry (a test's or a notebook's temporary component); returns it."""
    table = _check_kind(kind, load=False)
    if name not in table:
        raise ConfigError(f"{kind} {name!r} is not registered; registered {kind}s: {', '.join(sorted(table))}.")
    return table.pop(name)


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


def spec_arguments(kind: str, spec: dict[str, Any] | str, /, **shared: Any) -> tuple[str, dict[str, Any]]:
    """The name and keyword arguments that ``build_from_spec`` builds ``spec`` with: its own keys plus the
    ``shared`` settings the component accepts (the model passes those of ``SHARED[kind]``) that it does not set."""
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
    return name, kwargs


def build_from_spec(kind: str, spec: dict[str, Any] | str, /, **shared: Any) -> Any:
    """Build from ``{"name": ..., **kwargs}`` (or a bare name), adding the ``shared`` keywords
    the component accepts (``SHARED[kind]``: ``dim``, ``dim_x``, ...) unless the spec sets them itself."""
    name, kwargs = spec_arguments(kind, spec, **shared)
    return build(kind, name, **kwargs)


def with_defaults(kind: str, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``{"name": name, **kwargs}`` with every other constructor argument at its default, in signature order."""
    full: dict[str, Any] = {"name": name}
    for p in _signature(get(kind, name)):
        if p.name in kwargs:
            full[p.name] = kwargs[p.name]
        elif p.default is not inspect.Parameter.empty:
            full[p.name] = p.default
    full.update({k: v for k, v in kwargs.items() if k not in full})
    return full


def describe(kind: str, name: str) -> str:
    """First line of the component's docstring, without reStructuredText literal markup."""
    doc = inspect.getdoc(get(kind, name)) or ""
    return doc.splitlines()[0].replace("``", "") if doc else ""


@dataclass(frozen=True)
class Argument:
    """One constructor argument of a component, as ``gridtnp list KIND NAME`` shows it."""

    name: str
    annotation: str
    default: str | None  # None: required
    doc: str
    shared: bool  # passed in by the model (``SHARED[kind]``) unless the recipe sets it


def _docstrings(fn: Callable[..., Any]) -> list[str]:
    """The docstrings that may document ``fn``'s arguments: the class's and its ``__init__``'s, along the MRO."""
    if not inspect.isclass(fn):
        return [inspect.getdoc(fn) or ""]
    docs = []
    for cls in fn.__mro__:
        if cls.__module__.startswith(("torch", "lightning", "builtins")):
            break
        docs += [
            inspect.cleandoc(cls.__doc__ or ""),
            inspect.cleandoc(cls.__dict__.get("__init__", object).__doc__ or ""),
        ]
    return docs


def _signature(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """Keyword parameters of ``fn`` (for a class, its ``__init__``, following ``**kwargs`` into the parents')."""
    if not inspect.isclass(fn):
        return list(inspect.signature(fn).parameters.values())
    params: dict[str, inspect.Parameter] = {}
    for cls in fn.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        if cls.__module__.startswith(("torch", "lightning", "builtins")):
            break
        own = list(inspect.signature(init).parameters.values())[1:]
        for p in own:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                params.setdefault(p.name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in own):
            break
    return list(params.values())


def arguments(kind: str, name: str) -> list[Argument]:
    """The component's constructor arguments with types, defaults and one-line meanings."""
    fn = get(kind, name)
    documented: dict[str, str] = {}
    for doc in _docstrings(fn):
        for param in docstring_parser.parse(doc).params:
            documented.setdefault(param.arg_name, " ".join((param.description or "").split()))
    args = []
    for p in _signature(fn):
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        # Annotations are kept as written (``from __future__ import annotations``): "int | None" reads well as is.
        text = "" if p.annotation is inspect.Parameter.empty else _type_name(p.annotation)
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        shared = p.name in SHARED[kind]
        doc = documented.get(p.name) or SHARED[kind].get(p.name, "")
        args.append(Argument(p.name, text, default, doc, shared))
    return args


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("collections.abc.", "")


def document(kind: str, name: str) -> str:
    """The component's docstring (without its Args section) and a table of its arguments, for ``gridtnp list``."""
    fn = get(kind, name)
    parsed = docstring_parser.parse(inspect.getdoc(fn) or "")
    text = "\n\n".join(t for t in (parsed.short_description, parsed.long_description) if t)
    lines = [f"{kind} {name!r} ({fn.__module__}.{fn.__qualname__})", ""]
    lines += [f"  {line}" if line else "" for line in (text or "(no description)").replace("``", "").splitlines()]
    args = arguments(kind, name)
    lines += ["", "Arguments:" if args else "Arguments: none"]
    tag = "from the model specification" if kind == "model" else "set by the model"
    for a in args:
        head = f"  {a.name}" + (f": {a.annotation}" if a.annotation else "")
        head += " (required)" if a.default is None and not a.shared else f" = {a.default}" if a.default else ""
        lines.append(head)
        lines.append(f"      {a.doc.replace('``', '') or '(undocumented)'}" + (f"  [{tag}]" if a.shared else ""))
    shared = [a.name for a in args if a.shared]
    if shared:
        where = (
            "Taken from the model specification's top-level keys"
            if kind == "model"
            else "Set by the model unless the recipe sets them"
        )
        lines += ["", f"{where}: {', '.join(shared)}."]
    return "\n".join(lines)
