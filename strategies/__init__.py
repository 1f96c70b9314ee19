"""Basin's server side: the ServerApp, its strategies and their shared parts.

The model-averaging methods wrap any Flower strategy, Flower's own FedAvg and FedAdam
included, in a user's own ServerApp::

    from flwr.serverapp.strategy import FedAvg
    from strategies import IMA

    result = IMA(FedAvg(), window=5, start_round=150).start(grid=grid, initial_arrays=arrays, num_rounds=200)
"""

from clients.simulation_engine import install_engine_wakeup
from strategies.averaging import IMA, WIMA, ModelAveraging, ServerSWA

__all__ = ["IMA", "WIMA", "ModelAveraging", "ServerSWA"]

# In Flower's simulation process this package is the ServerApp thread's first import,
# made while the engine registers the simulated nodes: installing the engine changes now
# lets a large federation's node contexts be built from one read of the run config
# (clients/simulation_engine.py). Elsewhere it does nothing.
install_engine_wakeup()
