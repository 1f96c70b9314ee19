"""The README and docs/ hold together: every relative link leads to a file (and heading)
that exists, every `python -m` module they name exists, and every command they show with
``--help`` or ``--list…`` runs."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MODULE = re.compile(r"python -m ([a-z_][a-z0-9_.]*)")
# Processes the launcher starts by itself: named in the docs, not commands to type.
INTERNAL_MODULES = {"experiments.guardian"}


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def test_the_readme_links_the_docs_and_the_docs_index_links_every_page():
    index = (REPO / "docs" / "index.md").read_text()
    assert "docs/index.md" in (REPO / "README.md").read_text()
    missing = [page.name for page in PAGES[1:] if page.name != "index.md" and f"({page.name})" not in index]
    assert not missing, f"pages the index does not link: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(target)
        elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_every_module_the_docs_name_exists():
    named = {m.rstrip(".") for page in PAGES for m in MODULE.findall(page.read_text())} - {"pytest"}
    missing = sorted(m for m in named if importlib.util.find_spec(m) is None)
    assert not missing, f"`python -m` modules that do not exist: {missing}"


def _commands() -> list[str]:
    """Every `python -m …` command the docs show that asks for help or a listing."""
    found = set()
    for page in PAGES:
        for line in page.read_text().splitlines():
            match = re.search(r"python -m ([a-z_.]+)([^`|#]*)", line)
            if match and re.search(r"--(help|list[a-z-]*)\b", match.group(2)):
                found.add(f"{match.group(1)}{match.group(2)}".strip().rstrip("\\").strip())
    # And the help of every command-line module the docs name.
    for page in PAGES:
        found.update(f"{m} --help" for m in MODULE.findall(page.read_text()) if m not in INTERNAL_MODULES | {"pytest"})
    return sorted(found)


@pytest.mark.parametrize("command", _commands())
def test_every_help_and_listing_the_docs_show_runs(command):
    result = subprocess.run([sys.executable, "-m", *shlex.split(command)], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    assert result.returncode == 0, f"{command}: {result.stderr[-2000:]}"
    assert result.stdout.strip()
