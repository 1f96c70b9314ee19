"""What ``.venv/bin/python -m experiments.reproduce`` and ``experiments.api.reproduce`` do once
their arguments are parsed: the papers' tables as cells (table_cells.py), the runs and cost
measurements those cells need (runner.py), a verdict per cell (verdicts.py) and the report's
files (report_files.py). The tables' data is in experiments/paper_tables/.
"""
