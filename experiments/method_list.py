"""Every method and averaging rule Basin knows, with installed plug-ins and the broken ones;
and the files derived from Basin's own declarations, regenerated after a method is added:

    .venv/bin/python -m experiments.method_list                    # list them
    .venv/bin/python -m experiments.method_list --write-pyproject  # regenerate pyproject.toml's method keys
    .venv/bin/python -m experiments.method_list --write-docs       # regenerate docs/methods.md's table

How a method is added: docs/extending.md.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from clients.model_plugins import BROKEN_MODELS
from experiments.runtime.method_keys import PYPROJECT, write_pyproject
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.methods.registry import BROKEN_PLUGINS, REGISTRY, Declaration, Plugin, declarations


def _source(module: str) -> str:
    """A Basin module as its file's path from the repository's root; a plug-in's by its name."""
    root = PYPROJECT.parent
    path = root / Path(*module.split(".")).with_suffix(".py")
    return str(path.relative_to(root)) if path.is_file() else module


def _where(spec: Declaration) -> list[str]:
    """The modules of a declaration and of its client half."""
    halves = [*spec.client_components, *([spec.objective] if spec.objective is not None else [])] \
        if isinstance(spec, MethodSpec) else []
    modules = [REGISTRY.modules[spec.name],
               *(half.module if isinstance(half, ImplementedIn) else half.__module__ for half in halves)]
    return [_source(module) for module in dict.fromkeys(modules)]


def methods_table(with_plugins: bool = False) -> str:
    """docs/methods.md's table: a row per declaration with a ``table_row``, joined by the
    declarations after it in its module that have none (FedYogi, FedAdagrad under FedAdam)."""
    rows: list[tuple[str, list[str], TableRow, list[str]]] = []  # key, names, row, where
    for spec in declarations():
        if spec.name in REGISTRY.plugins and not with_plugins:
            continue
        key = "strategy" if isinstance(spec, MethodSpec) else "averaging"
        joins = rows and spec.table_row is None and rows[-1][0] == key and \
            REGISTRY.modules[rows[-1][1][0]] == REGISTRY.modules[spec.name]
        if joins:
            rows[-1][1].append(spec.name)
            rows[-1][3].extend(source for source in _where(spec) if source not in rows[-1][3])
        elif spec.table_row is None:
            raise ValueError(f"{spec.name}: declares no table_row (docs/methods.md's line) and follows none in its module")
        else:
            rows.append((key, [spec.name], spec.table_row, _where(spec)))
    lines = ["| key | method: paper, what is implemented | default variant (other options) | "
             "traffic per client and round: down, up (× the model) | where |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{key} = {' / '.join(names)}` | {row.implements} | {row.variants} | {_traffic(key, names)} | "
              f"{', '.join(f'`{source}`' for source in where)} |" for key, names, row, where in rows]
    return "\n".join(lines)


def _traffic(key: str, names: list[str]) -> str:
    """The methods' measured traffic (experiments.costs's down × and up ×), one value where
    the row's methods agree; an averaging rule sends what its base method sends."""
    if key == "averaging":
        return "its base method's"
    # Measured on a round of each method's strategy: torch and Flower are imported only here.
    from experiments.measurement.method_costs import traffic_in_models

    def multiple(value: float) -> str:
        return f"{value:.3f}".rstrip("0").rstrip(".")

    cells = {name: ", ".join(map(multiple, traffic_in_models(name))) for name in names}
    if len(set(cells.values())) == 1:
        return next(iter(cells.values()))
    return "; ".join(f"{name}: {cell}" for name, cell in cells.items())


def _origin(plugin: Plugin) -> str:
    torch = ("; its module imports torch into the launcher: name its torch code with ImplementedIn "
             "(docs/extending.md)") if plugin.imports_torch else ""
    return plugin.describe() + torch


METHODS_PAGE = PYPROJECT.parent / "docs" / "methods.md"
TABLE_START = "<!-- the methods table: generated from the declarations by `.venv/bin/python -m experiments.method_list --write-docs` -->"
TABLE_END = "<!-- end of the methods table -->"


def write_docs(path: Path = METHODS_PAGE) -> bool:
    """Replace the generated table of ``path`` (Basin's own methods); True when it changed."""
    text = path.read_text()
    pattern = re.compile(re.escape(TABLE_START) + r".*?" + re.escape(TABLE_END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{path} has no generated methods table ({TABLE_START!r} … {TABLE_END!r})")
    new = pattern.sub(lambda _: f"{TABLE_START}\n{methods_table()}\n{TABLE_END}", text)
    if new != text:
        path.write_text(new)
    return new != text


def listing() -> str:
    """Each method and averaging rule, a plug-in's origin beside it (and whether loading it
    brought torch into the launcher), then the broken plug-ins, methods' and models'."""
    lines = [f"{spec.name:18s} {spec.display_name}" + (f"  [{_origin(REGISTRY.plugins[spec.name])}]"
                                                       if spec.name in REGISTRY.plugins else "")
             for spec in declarations()]
    broken = [*(f"{name:18s} error: {plugin.line()}" for name, plugin in BROKEN_PLUGINS.items()),
              *(f"{name:18s} error: {model.line()}" for name, model in BROKEN_MODELS.items())]
    return "\n".join([*lines, *broken])



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.method_list", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-pyproject", action="store_true",
                        help="rewrite pyproject.toml's generated block of method keys (Basin's own methods)")
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite docs/methods.md's generated table of methods (Basin's own methods)")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    if arguments.write_pyproject:
        print("pyproject.toml " + ("updated" if write_pyproject() else "already up to date"))
    if arguments.write_docs:
        print("docs/methods.md " + ("updated" if write_docs() else "already up to date"))
    if not (arguments.write_pyproject or arguments.write_docs):
        print(listing())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
