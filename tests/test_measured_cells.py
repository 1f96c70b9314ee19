"""The measured cells (experiments/reproduction/measured_cells.py): the docs' table and README's
count are generated from experiments/measured/cells.csv, the paper's numbers from the tables."""

from __future__ import annotations

import pytest

from experiments.reproduction.measured_cells import (
    BEGIN,
    END,
    README,
    TABLE_PAGE,
    cells_table,
    count_sentence,
    measured_cells,
)


def _generated_part(text: str) -> str:
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def test_the_docs_show_the_measured_cells_as_generated_from_the_file():
    """A number typed into docs/reproducing.md or README.md, or a cell added to the file without
    --write, fails here."""
    frame = measured_cells()
    assert _generated_part(TABLE_PAGE.read_text()) == cells_table(frame)
    assert _generated_part(README.read_text()) == count_sentence(frame)


def test_the_paper_value_comes_from_the_table_and_the_verdict_uses_its_tolerance(tmp_path):
    path = tmp_path / "cells.csv"
    path.write_text("table,cell,basin,seed,device,date,flwr,torch,how\n"
                    "ima-table1,\"FedAvg | FMNIST (CNN), #C = 2\",84.10,0,cpu,2026-12-07,1.42.0,2.14.1,test\n"
                    "ima-table1,\"FedAvg | FMNIST (CNN), #C = 2 | + IMA\",87.69,0,cpu,2026-12-07,1.42.0,2.14.1,test\n")
    frame = measured_cells(path)
    assert frame["paper"].tolist() == [81.17, 84.68]  # ima-table1.toml's
    assert frame["verdict"].tolist() == ["match", "differs"]  # +2.93 within 3 points, +3.01 not
    assert "| +3.51 | +3.59 |" in cells_table(frame)  # the pair's gains, the paper's and Basin's
    assert count_sentence(frame).startswith("Basin has numbers for 2 of the 807 cells")
    path.write_text("table,cell,basin,seed,device,date,flwr,torch,how\nima-table1,FedAvg | nowhere,1,0,a,b,c,d,e\n")
    with pytest.raises(ValueError, match="table ima-table1 has no cell 'FedAvg | nowhere'"):
        measured_cells(path)
