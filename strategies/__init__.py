"""Basin's server side: the ServerApp, its strategies and their shared parts."""

from clients.simulation_engine import install_engine_wakeup

# In Flower's simulation process this package is the ServerApp thread's first import,
# made while the engine registers the simulated nodes: installing the engine changes now
# lets a large federation's node contexts be built from one read of the run config
# (clients/simulation_engine.py). Elsewhere it does nothing.
install_engine_wakeup()
