"""Are two runs the same to the bit? ``.venv/bin/python -m experiments.run --check-reproducible A B``.

Compares two run folders (each a run's ``--out``): every round of ``results.csv`` without
its timing columns (wall-clock seconds and GPU memory, which no seed fixes), written as
the ServerApp wrote them, i.e. to the last digit of each number's shortest round-trip
form; then every tensor of ``final_model.pt``, bit for bit. It says the first round and
the columns where the results differ, the first tensor of the final model that differs
and by how much, and where the two runs' ``arithmetic`` records in ``summary.json``
differ (versions, device, torch threads, CUDA flags), the usual reason.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

# results.csv columns that measure the machine, not the computation.
MACHINE_COLUMNS = ("client-gpu-mib",)


def _is_machine_column(column: str) -> bool:
    # simulated-seconds is the simulated clock's (strategies/system_clock.py): seeded, compared
    return (column.endswith("-seconds") and column != "simulated-seconds") or column in MACHINE_COLUMNS


@dataclass
class Comparison:
    """What :func:`compare_runs` found; ``differences`` is empty when the runs are equal."""

    rounds: int = 0
    tensors: int = 0
    differences: list[str] = field(default_factory=list)
    arithmetic: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences

    def report(self, a: Path, b: Path) -> str:
        if self.identical:
            return (f"identical: {a} and {b}: {self.rounds} rounds of results.csv (timing columns aside) and "
                    f"all {self.tensors} tensors of final_model.pt, bit for bit")
        lines = [f"different: {a} and {b}:", *(f"  {line}" for line in self.differences)]
        if self.arithmetic:
            lines.append("  what fixed their arithmetic differs: " + "; ".join(self.arithmetic))
        return "\n".join(lines)


def _rows(directory: Path) -> list[dict[str, str]]:
    with open(directory / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def compare_results(a: Path, b: Path, comparison: Comparison) -> None:
    rows_a, rows_b = _rows(a), _rows(b)
    columns_a = [c for c in (rows_a[0] if rows_a else {}) if not _is_machine_column(c)]
    columns_b = [c for c in (rows_b[0] if rows_b else {}) if not _is_machine_column(c)]
    if columns_a != columns_b:
        comparison.differences.append(f"results.csv columns differ: {sorted(set(columns_a) ^ set(columns_b))}")
        return
    comparison.rounds = min(len(rows_a), len(rows_b))
    for row_a, row_b in zip(rows_a, rows_b):
        changed = [c for c in columns_a if row_a[c] != row_b[c]]
        if changed:
            shown = ", ".join(f"{c} {row_a[c]} vs {row_b[c]}" for c in changed[:4])
            comparison.differences.append(
                f"results.csv: first difference at round {row_a.get('round', '?')}: {shown}"
                + (f" (+{len(changed) - 4} more columns)" if len(changed) > 4 else ""))
            break
    if len(rows_a) != len(rows_b):
        comparison.differences.append(f"results.csv: {len(rows_a)} rounds vs {len(rows_b)}")


def compare_models(a: Path, b: Path, comparison: Comparison) -> None:
    import torch

    paths = [a / "final_model.pt", b / "final_model.pt"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        comparison.differences.append(f"no final model: {', '.join(missing)} (an unfinished run?)")
        return
    model_a, model_b = (torch.load(p, map_location="cpu", weights_only=True) for p in paths)
    if list(model_a) != list(model_b):
        comparison.differences.append(f"final_model.pt: different tensors: {sorted(set(model_a) ^ set(model_b))}")
        return
    comparison.tensors = len(model_a)
    for name in model_a:
        x, y = model_a[name], model_b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            comparison.differences.append(f"final_model.pt: first difference in {name!r}: {x.shape}/{x.dtype} vs "
                                          f"{y.shape}/{y.dtype}")
            return
        if not torch.equal(x, y):
            delta = (x.double() - y.double()).abs()
            comparison.differences.append(
                f"final_model.pt: first difference in {name!r}: {int((x != y).sum())} of {x.numel()} elements, "
                f"max |difference| {float(delta.max()):.3g}")
            return


def compare_arithmetic(a: Path, b: Path, comparison: Comparison) -> None:
    records = []
    for directory in (a, b):
        try:
            records.append(json.loads((directory / "summary.json").read_text()).get("arithmetic", {}))
        except (OSError, ValueError):
            records.append({})
    first, second = records
    comparison.arithmetic = [f"{key} {first.get(key)} vs {second.get(key)}"
                             for key in dict.fromkeys([*first, *second]) if first.get(key) != second.get(key)]


def compare_runs(a: Path, b: Path) -> Comparison:
    """Compare the run folders ``a`` and ``b`` (see the module docstring)."""
    for directory in (a, b):
        if not (directory / "results.csv").is_file():
            raise FileNotFoundError(f"{directory} holds no results.csv: not a run's output folder")
    comparison = Comparison()
    compare_results(a, b, comparison)
    compare_models(a, b, comparison)
    compare_arithmetic(a, b, comparison)
    return comparison
