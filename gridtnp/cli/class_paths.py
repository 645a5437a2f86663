"""Which modules a recipe's ``class_path`` may import: importing a module runs its code before jsonargparse checks
the class's type, so a recipe names classes of gridtnp, Lightning, torch and the packages registered through the
``gridtnp.components`` entry point, or of modules already imported; any other module is refused before it is
imported, with one line saying how to allow it.

* ``guarded_imports()``: a context manager under which jsonargparse resolves ``class_path`` values this way.
* ``ALLOW_ENV``: the environment variable listing more top-level packages to allow (``GRIDTNP_ALLOW_IMPORTS=a,b``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from gridtnp.registry import ENTRY_POINT_GROUP, ConfigError

ALLOW_ENV = "GRIDTNP_ALLOW_IMPORTS"
OWN_PACKAGES = ("gridtnp", "lightning", "pytorch_lightning", "torch", "torchmetrics")


def allowed_packages() -> set[str]:
    """The top-level packages a ``class_path`` may import: gridtnp's, the entry-point plugins', ``ALLOW_ENV``'s."""
    allowed = set(OWN_PACKAGES)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        allowed.add(entry.value.split(":")[0].split(".")[0])
    allowed.update(p.strip() for p in os.environ.get(ALLOW_ENV, "").split(",") if p.strip())
    return allowed


def check_class_path(name: str) -> None:
    """Refuse ``name`` (``package.module.Class``) when importing it would run a module not allowed here."""
    if not isinstance(name, str) or "." not in name:
        return
    module = name.rsplit(".", 1)[0]
    if module in sys.modules or name.split(".")[0] in allowed_packages():
        return
    raise ConfigError(
        f"class_path {name!r}: gridtnp imports classes only from gridtnp, Lightning, torch and packages registered "
        f"through the {ENTRY_POINT_GROUP!r} entry point (docs/extending.md); register the package there, or allow it "
        f"for this run with {ALLOW_ENV}={name.split('.')[0]}."
    )


def _guarded(import_object: Callable[..., Any]) -> Callable[..., Any]:
    def guarded_import_object(name: str, *args: Any, **kwargs: Any) -> Any:
        check_class_path(name)
        return import_object(name, *args, **kwargs)

    guarded_import_object.unguarded = import_object  # type: ignore[attr-defined]
    return guarded_import_object


@contextlib.contextmanager
def guarded_imports() -> Iterator[None]:
    """jsonargparse's ``import_object`` (in each of its modules that holds it) checked by ``check_class_path``."""
    from jsonargparse import _util

    original = getattr(_util.import_object, "unguarded", _util.import_object)
    if original is not _util.import_object:  # already guarded (a nested CLI)
        yield
        return
    guarded = _guarded(original)
    modules = [m for n, m in list(sys.modules.items()) if n.startswith("jsonargparse") and m is not None]
    patched = [m for m in modules if vars(m).get("import_object") is original]  # no module __getattr__
    for module in patched:
        module.import_object = guarded
    try:
        yield
    finally:
        for module in patched:
            module.import_object = original
