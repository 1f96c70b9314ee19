"""Basin's server side: the ServerApp, its strategies and their shared parts.

The model-averaging methods wrap any Flower strategy, Flower's own FedAvg and FedAdam
included, in a user's own ServerApp::

    from flwr.serverapp.strategy import FedAvg
    from strategies import IMA

    result = IMA(FedAvg(), window=5, avg_start=150).start(grid=grid, initial_arrays=arrays, num_rounds=200)

and a user's own ClientApp takes IMA's client schedule (the exploration lr after t_s) from
``ima_client_schedule`` (SWA's cycles from ``swa_client_schedule``), which imports no torch.

Importing Basin changes nothing in Flower: its engine replacements
(clients/simulation_engine.py) go in only where Basin's own simulation command runs.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strategies.averaging import ModelAveraging
    from strategies.averaging_wrappers import IMA, WIMA, ServerSWA

from strategies.schedules import ClientSchedule, ima_client_schedule, swa_client_schedule

__all__ = ["IMA", "WIMA", "ModelAveraging", "ServerSWA", "ClientSchedule", "ima_client_schedule", "swa_client_schedule"]


def __getattr__(name: str):
    """``from strategies import IMA`` imports the averaging modules (and torch) when asked:
    the ClientApp's entry (strategies/client_app.py) loads this package without them."""
    if name in ("IMA", "WIMA", "ModelAveraging", "ServerSWA"):
        from strategies import averaging_wrappers  # it imports ModelAveraging too

        return getattr(averaging_wrappers, name)
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")
