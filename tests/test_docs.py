"""The README and docs/ stay a short landing page and linked reference pages that hold no machine paths or history."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 200
PAGES = sorted(p for p in [README, *(ROOT / "docs").glob("*.md"), ROOT / "benchmarks" / "README.md"] if p.is_file())

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(work|tmp|home|Users)/")
HISTORY_WORD = re.compile(r"\b(session|helper)s?\b", re.IGNORECASE)
ALLOWED_PHRASES = re.compile(r"\b(slurm|interactive|salloc|srun|ssh) sessions?\b", re.IGNORECASE)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (where `](` may be code, not a link)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def link_targets(text: str) -> list[str]:
    """Relative link targets of a Markdown text, without anchors; external links and bare anchors left out."""
    text = prose(text)
    targets = [*LINK.findall(text), *REFERENCE.findall(text)]
    paths = [t.split("#", 1)[0] for t in targets if not EXTERNAL.match(t)]
    return [p for p in paths if p]


def test_readme_is_a_landing_page():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; keep it to {MAX_README_LINES}, the rest in docs/"


def test_the_readme_links_the_docs():
    targets = set(link_targets(README.read_text()))
    assert "docs/cli.md" in targets and "docs/extending.md" in targets


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_relative_links_point_to_files(page):
    missing = [t for t in link_targets(page.read_text()) if not (page.parent / t).exists()]
    assert not missing, f"{relative(page)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_no_machine_paths(page):
    found = sorted({m.group(0) for m in MACHINE_PATH.finditer(page.read_text())})
    assert not found, f"{relative(page)} names absolute machine paths ({found}); write paths relative to the repo"


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_no_history_words(page):
    text = ALLOWED_PHRASES.sub("", page.read_text())
    lines = [f"{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if HISTORY_WORD.search(line)]
    assert not lines, f"{relative(page)} narrates how the work was done (history belongs in CHANGELOG.md): {lines}"


def test_link_parser():
    text = (
        "[a](docs/cli.md) [b](docs/data.md#3-bad-input) [c](#layout) [d](https://example.org/x.md) "
        '![e](img.png "title") `[f](code.md)`\n[g]: ../README.md\n```\n[h](fenced.md)\n```\n'
    )
    assert link_targets(text) == ["docs/cli.md", "docs/data.md", "img.png", "../README.md"]


def test_the_layout_names_every_module() -> None:
    """docs/architecture.md's Layout lists every module of the package, so it cannot fall behind a new file."""
    layout = (ROOT / "docs" / "architecture.md").read_text().split("## Layout", 1)[1]
    modules = sorted(p for p in (ROOT / "gridtnp").rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    missing = [str(p.relative_to(ROOT)) for p in modules if p.name not in layout]
    assert not missing, f"docs/architecture.md's Layout does not list: {missing}"
