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
INTERNAL_MODULES = {"experiments.runtime.guardian"}


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


# A Basin command printed with a bare `python`: without an activated environment it fails
# (ModuleNotFoundError: flwr); the docs and every --help say `.venv/bin/python`.
BARE_PYTHON = re.compile(r"(?<![\w/.\-])python -m (experiments|strategies|pytest)\b")


def test_every_command_the_docs_print_runs_with_the_environments_python():
    bare = [f"{page.name}: …{match.group(0)}…" for page in PAGES
            for match in BARE_PYTHON.finditer(re.sub(r"\s+", " ", page.read_text()))]
    assert not bare, f"commands with a bare `python` (write `.venv/bin/python`): {bare}"


@pytest.mark.parametrize("command", _commands())
def test_every_help_and_listing_the_docs_show_runs(command):
    result = subprocess.run([sys.executable, "-m", *shlex.split(command)], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    assert result.returncode == 0, f"{command}: {result.stderr[-2000:]}"
    assert result.stdout.strip()
    assert not BARE_PYTHON.search(re.sub(r"\s+", " ", result.stdout)), f"{command} prints a bare `python -m`"


# ---- every command block the docs show, run (slow tier) ---------------------------------------
#
# Each ```bash block in README.md and docs/ carries a marker on the line before it:
#   <!-- docs-test: run [ARGS] -->   its Basin commands (python -m experiments.…, python
#                                     examples/…) run in order, in one scratch folder per page,
#                                     each with ARGS appended (tiny overrides: the digits, few
#                                     rounds) unless it only asks for --help or a listing;
#   <!-- docs-test: skip: WHY -->    an example only (a GPU, a cluster, hours of data), with why.
MARKER = re.compile(r"<!-- docs-test: (run|skip)(?::\s*|\s*)(.*?) -->")
BASIN_COMMAND = re.compile(r"(?:\.venv/bin/)?python (-m experiments\.|examples/)")


def _bash_blocks(page: Path) -> list[tuple[int, str | None, list[str]]]:
    """(line, marker, commands) of each ```bash block: continuation lines joined."""
    lines = page.read_text().splitlines()
    blocks = []
    for number, line in enumerate(lines):
        if line.strip() != "```bash":
            continue
        marker = lines[number - 1].strip() if number else ""
        body = []
        for text in lines[number + 1:]:
            if text.strip() == "```":
                break
            body.append(text)
        joined = re.sub(r"\\\n\s*", " ", "\n".join(body)).splitlines()
        blocks.append((number + 1, marker if MARKER.fullmatch(marker) else None, joined))
    return blocks


def test_every_command_block_says_whether_the_docs_test_runs_it():
    unmarked = [f"{page.name}:{line}" for page in PAGES for line, marker, _ in _bash_blocks(page) if marker is None]
    assert not unmarked, f"```bash blocks without a <!-- docs-test: run|skip: why --> line before them: {unmarked}"
    reasonless = [f"{page.name}:{line}" for page in PAGES for line, marker, _ in _bash_blocks(page)
                  if marker and MARKER.fullmatch(marker).group(1) == "skip" and not MARKER.fullmatch(marker).group(2)]
    assert not reasonless, f"skipped blocks must say why: {reasonless}"


def _basin_commands(command_line: str, extra: str) -> list[list[str]]:
    """The Basin commands of one shell line (parts joined by &&), as argument lists for
    this Python: comments, ``[optional]`` arguments and other programs dropped."""
    commands = []
    for part in command_line.split("&&"):
        if not BASIN_COMMAND.search(part):
            continue
        words = shlex.split(part[BASIN_COMMAND.search(part).start():], comments=True)
        kept, optional = [], 0
        for word in words[1:]:
            optional += word.count("[") - word.count("]") if word.startswith("[") or optional else 0
            if optional or word.startswith("[") or word.endswith("]"):
                continue
            kept.append(str(REPO / word) if word.startswith("examples/") else word)
        listing = any(re.fullmatch(r"--(help|list[a-z-]*)", w) for w in kept)
        commands.append([sys.executable, *kept, *([] if listing else shlex.split(extra))])
    return commands


RUNNABLE_PAGES = [page for page in PAGES if any(
    marker and MARKER.fullmatch(marker).group(1) == "run" for _, marker, _ in _bash_blocks(page))]


def _run_page(page: Path, folder: Path) -> str:
    """Run the Basin commands of a page's runnable blocks in order, in ``folder``: '' when
    each exited 0, else what the first that did not printed."""
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    ran = 0
    for line, marker, lines in _bash_blocks(page):
        kind, extra = MARKER.fullmatch(marker).groups()
        if kind != "run":
            continue
        for command_line in lines:
            for command in _basin_commands(command_line, extra):
                shown = " ".join(command[1:])
                try:
                    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
                except subprocess.TimeoutExpired:  # this page's test fails, the other pages' go on
                    return f"{page.name}:{line}: {shown}: still running after 900 s"
                if result.returncode != 0:
                    return f"{page.name}:{line}: {shown}\n{result.stdout[-1500:]}\n{result.stderr[-3000:]}"
                ran += 1
    return "" if ran else f"{page.name}: no command ran"


# Pages whose blocks run at once: one page's commands leave a core idle much of the time
# (each command a process that loads alone, a hung client's round-timeout), and the pages
# are independent (each in its folder). Two at once: 150 s for the six pages instead of 162 s
# one at a time (2 cores, 2026-11-29; three or more were not tried).
PAGES_AT_ONCE = 2


@pytest.fixture(scope="session")
def page_runs(request, tmp_path_factory) -> dict[Path, str]:
    """The runnable pages of this session's selected tests, each run by :func:`_run_page`,
    PAGES_AT_ONCE at a time, when the first of those tests starts (the longest pages, the
    README and analysis.md, first)."""
    from concurrent.futures import ThreadPoolExecutor

    selected = [item.callspec.params["page"] for item in request.session.items
                if item.originalname == "test_every_runnable_command_block_runs"]
    with ThreadPoolExecutor(max_workers=PAGES_AT_ONCE) as pool:
        futures = {page: pool.submit(_run_page, page, tmp_path_factory.mktemp(page.stem)) for page in selected}
    return {page: future.result() for page, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=lambda p: p.name)
def test_every_runnable_command_block_runs(page, page_runs):
    failure = page_runs[page]
    assert not failure, failure


def test_every_python_snippet_of_the_docs_names_only_what_it_defines_or_imports():
    """A reader can run what the docs show: no ```python block uses a name it does not
    define or import (ruff's undefined-name check, F821, on each block alone)."""
    undefined = []
    for page in PAGES:
        text = page.read_text()
        for block in re.finditer(r"```python\n(.*?)```", text, re.S):
            result = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F821", "--output-format",
                                     "concise", "--stdin-filename", "snippet.py", "-"], input=block.group(1),
                                    capture_output=True, text=True, timeout=60)
            line = text[:block.start()].count("\n") + 1
            undefined += [f"{page.name}:{line}: {found.split('Undefined name ')[1]}" for found in result.stdout.splitlines()
                          if "F821" in found]
    assert not undefined, undefined


def test_every_method_and_averaging_rule_has_its_paper_in_the_references():
    """docs/references.md cites every declared method and averaging rule by its key, and
    the licence and citation files exist and agree with pyproject.toml."""
    import tomllib

    import yaml

    from strategies.methods.registry import AVERAGINGS_BY_NAME, METHODS_BY_NAME, REGISTRY

    text = (REPO / "docs" / "references.md").read_text()
    cited = set(re.findall(r"`([a-z0-9-]+)`", text)) | set(re.findall(r"`averaging = ([a-z]+)`", text))
    missing = [name for name in [*METHODS_BY_NAME, *AVERAGINGS_BY_NAME] if name not in REGISTRY.plugins and name not in cited]
    assert not missing, f"methods without a reference: {missing}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert (citation["version"], citation["license"]) == (project["version"], project["license"])
    assert str(citation["date-released"]).startswith("20")  # what, with the version, identifies a release
    # The example plug-ins' methods too (examples/<name> with a basin_<name> package declaring METHODS).
    examples = [folder.name for folder in sorted((REPO / "examples").iterdir())
                if any("METHODS" in f.read_text() for f in folder.glob("basin_*/__init__.py"))]
    assert {"feddecorr", "fedlc"} <= set(examples)
    assert not [name for name in examples if f"`examples/{name}`" not in text], "example plug-ins without a reference"
    assert "Apache License" in (REPO / "LICENSE").read_text() and project["license"] == "Apache-2.0"


def test_ci_runs_the_readmes_test_command_as_written():
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("```bash\n") + len("```bash\n"):]
    test_command = block.splitlines()[1]
    assert "pytest" in test_command and test_command in (REPO / ".ci" / "run").read_text()


# Phrases of pages that speak of how they were written (who had which machine, what "we"
# did) instead of the project and its measurements: such history goes to CHANGELOG.md.
HISTORY_PHRASES = ("the session that", "no gpu was lent", "we copied", "not tried here", "not kept",
                   "seconds per load here", "the text we")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_docs_speak_of_the_project_not_of_how_they_were_written(page):
    text = " ".join(page.read_text().lower().split())
    found = [phrase for phrase in HISTORY_PHRASES if phrase in text]
    assert not found, f"{page.name} says {found}: state the project's figure (machine, date), history in CHANGELOG.md"


def test_a_block_that_names_a_file_shows_that_file():
    """A ```python block whose first line names a file of the repository "(the whole file but
    its docstring)" holds exactly that file's code after its docstring: the example's ServerApp
    in README and docs/your-own-app.md (they held other numbers than the file reads)."""
    named = re.compile(r"```python\n# (\S+\.py) \(the whole file but its docstring\)\n(.*?)```", re.S)
    shown = 0
    for page in PAGES:
        for block in named.finditer(page.read_text()):
            source = (REPO / block.group(1)).read_text()
            body = source[source.index('"""', 3) + 3:].lstrip("\n") if source.startswith('"""') else source
            assert block.group(2) == body, f"{page.name}: the block of {block.group(1)} is not the file"
            shown += 1
    assert shown >= 2
