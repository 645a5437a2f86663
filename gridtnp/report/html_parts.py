"""Pieces of the ``gridtnp report`` page: figures embedded as PNG data and plain tables.

* ``png_data(figure)``: a matplotlib figure as a ``data:`` URI; ``figure_html(name, figure, caption)``: as a
  ``<figure>`` with its caption.
* ``html_table(head, rows, classes, tid)``: a table of formatted cells.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any


def png_data(figure: Any, dpi: int = 90) -> str:
    """A matplotlib figure as a ``data:image/png;base64,...`` URI."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def figure_html(name: str, figure: Any, caption: str) -> str:
    """``figure`` embedded in a ``<figure id=name>`` with its caption."""
    esc = html.escape
    return (
        f'<figure id="{esc(name)}"><img alt="{esc(name)}" src="{png_data(figure)}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def html_table(head: list[str], rows: list[list[str]], classes: list[str] | None = None, tid: str = "") -> str:
    """A plain HTML table; ``rows`` are already-formatted cells, the first column a name (all escaped here)."""
    heads = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = []
    for i, row in enumerate(rows):
        kind = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f"<td>{html.escape(c)}</td>" for c in row)
        body.append(f"<tr{kind}>{cells}</tr>")
    ident = f' id="{tid}"' if tid else ""
    return f"<table{ident}><thead><tr>{heads}</tr></thead><tbody>{''.join(body)}</tbody></table>"
