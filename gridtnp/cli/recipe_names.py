"""Recipes name a DataModule by its registry name: ``data: {class_path: era5_stations, init_args: {...}}``.

jsonargparse resolves a ``class_path`` without dots by class name among the imported subclasses; a registry name
is not a class name, so the recipe loader (``load_recipe``, the jsonargparse parser mode ``RECIPE_MODE``) writes a
registered ``datamodule`` name as its class's import path before parsing. Full import paths and class names pass
unchanged, and the parsed (and saved) config holds the import path.
"""

from __future__ import annotations

from typing import Any

import yaml
from jsonargparse import get_loader, set_loader

from gridtnp.registry import available, get

#: The jsonargparse parser mode of gridtnp's recipes: YAML, with DataModules by registry name.
RECIPE_MODE = "gridtnp_yaml"


def datamodule_path(name: str) -> str:
    """The import path of ``name`` when it is a registered DataModule's registry name; ``name`` itself otherwise."""
    if "." in name or name not in available("datamodule"):
        return name
    cls = get("datamodule", name)
    return f"{cls.__module__}.{cls.__qualname__}"


def load_recipe(text: str) -> Any:
    """A recipe (or a value) as jsonargparse's YAML loader reads it, ``data.class_path`` resolved by registry name."""
    value = _yaml_load(text)
    data = value.get("data") if isinstance(value, dict) else None
    if isinstance(data, dict) and isinstance(data.get("class_path"), str):
        data["class_path"] = datamodule_path(data["class_path"])
    return value


_yaml_load = get_loader("yaml")
set_loader(RECIPE_MODE, load_recipe, exceptions=(yaml.YAMLError,))
