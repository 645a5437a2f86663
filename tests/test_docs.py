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


HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown text's headings: lower case, punctuation dropped, spaces as hyphens."""
    slugs: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n, unique = 0, slug
        while unique in slugs:
            n += 1
            unique = f"{slug}-{n}"
        slugs.add(unique)
    return slugs


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_anchors_point_to_headings(page):
    """A link to `page.md#anchor` (or `#anchor` on the same page) names a heading of that page."""
    text = prose(page.read_text())
    broken = []
    for target in [*LINK.findall(text), *REFERENCE.findall(text)]:
        if EXTERNAL.match(target) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        file = page if not path else page.parent / path
        if file.suffix == ".md" and file.is_file() and anchor not in anchors(file.read_text()):
            broken.append(target)
    assert not broken, f"{relative(page)} links to anchors that no heading has: {broken}"


def test_anchor_slugs():
    assert anchors("# A: `b_c` and d's (e)\n## On a GPU\n## On a GPU\n") == {"a-b_c-and-ds-e", "on-a-gpu", "on-a-gpu-1"}


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


RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
MAX_RECIPE_HEADER_LINES = 12
DETAILS = re.compile(r"docs/recipes\.md#([\w-]+)")


def header(recipe: Path) -> list[str]:
    """The leading comment block of a recipe."""
    lines = recipe.read_text().splitlines()
    n = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return lines[:n]


@pytest.mark.parametrize("recipe", RECIPES, ids=relative)
def test_recipe_headers_are_short(recipe):
    """A recipe opens with at most 12 comment lines; the detail lives in docs/recipes.md, linked by anchor."""
    lines = header(recipe)
    assert len(lines) <= MAX_RECIPE_HEADER_LINES, (
        f"{relative(recipe)} opens with {len(lines)} comment lines; keep it to {MAX_RECIPE_HEADER_LINES} and move the"
        " detail into a section of docs/recipes.md, linked by '# Details: docs/recipes.md#<anchor>'"
    )
    known = anchors((ROOT / "docs" / "recipes.md").read_text())
    missing = [a for a in DETAILS.findall("\n".join(lines)) if a not in known]
    assert not missing, f"{relative(recipe)} links to sections docs/recipes.md lacks: {missing}"
