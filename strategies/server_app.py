"""The ServerApp of a Basin run (pyproject.toml's ``serverapp``); its work is
strategies/server_work.py, imported when the run starts.

Flower's simulation loads the ServerApp and the ClientApp one after the other under one
lock (``load_app``), then starts Ray: a ServerApp module that imported torch and the
methods (~5 s on 2 CPU cores, while the ClientApp waited) delayed Ray's start by as
much. This module imports only Flower's ServerApp, so the ClientApp loads and Ray starts
while the ServerApp's own imports run in its thread.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    from strategies import server_work

    server_work.main(grid, context)
