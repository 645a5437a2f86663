"""Markdown tables of the registry, and the marked regions of documentation pages that hold them.

``gridtnp list --markdown TABLE`` prints a table; ``gridtnp list --docs PAGE... [--check]`` rewrites (or, with
``--check``, compares) every region of the pages that is marked

    <!-- gridtnp list --markdown TABLE -->
    ...
    <!-- end gridtnp list -->

so a page's tables of components and shared arguments are the registry's, not a copy that drifts.

* ``components``: every component of the package, one row each: kind, registry name, first docstring line.
* ``shared``: per kind, the settings the model passes in (``SHARED``), with their meanings.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

from gridtnp.registry import KINDS, SHARED, ConfigError, available, describe, get

REGION = re.compile(
    r"(?P<open><!-- gridtnp list --markdown (?P<table>\w+) -->\n)(?P<body>.*?)(?P<close><!-- end gridtnp list -->)",
    re.DOTALL,
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _own(kind: str, name: str) -> bool:
    """A component gridtnp defines (not a plugin's, not a test's): what the package's pages document."""
    module = inspect.getmodule(get(kind, name))
    return module is not None and module.__name__.startswith("gridtnp.") and not name.startswith("_")


def components_table() -> str:
    """``| kind | name | what it is |``: every registered component of gridtnp, by kind in ``KINDS`` order."""
    rows = ["| kind | name | what it is |", "| --- | --- | --- |"]
    for kind in KINDS:
        rows += [f"| `{kind}` | `{n}` | {_cell(describe(kind, n))} |" for n in available(kind) if _own(kind, n)]
    return "\n".join(rows)


def shared_table() -> str:
    """``| kind | shared arguments the model passes in |``: ``SHARED`` with each setting's meaning."""
    rows = ["| kind | shared arguments the model passes in (when the constructor takes them) |", "| --- | --- |"]
    for kind, settings in SHARED.items():
        if settings:
            rows.append(f"| `{kind}` | " + "; ".join(f"`{k}`: {_cell(v)}" for k, v in settings.items()) + " |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[], str]] = {"components": components_table, "shared": shared_table}


def render(table: str) -> str:
    """The markdown of ``table`` (one of ``TABLES``)."""
    if table not in TABLES:
        raise ConfigError(f"Unknown table {table!r}; tables: {', '.join(TABLES)}.")
    return TABLES[table]()


def render_page(text: str, where: str = "page") -> str:
    """``text`` with every marked region holding its table as the registry gives it now."""

    def fill(match: re.Match[str]) -> str:
        try:
            body = render(match["table"])
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        return f"{match['open']}{body}\n{match['close']}"

    return REGION.sub(fill, text)


def update_pages(paths: list[str], check: bool) -> list[str]:
    """Rewrite the marked regions of ``paths`` (``check``: leave them); returns the pages that were (or are) stale."""
    stale = []
    for path in paths:
        text = Path(path).read_text()
        if not REGION.search(text):
            raise ConfigError(f"{path} has no region marked <!-- gridtnp list --markdown TABLE -->.")
        new = render_page(text, path)
        if new != text:
            stale.append(path)
            if not check:
                Path(path).write_text(new)
    return stale
