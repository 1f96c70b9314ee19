"""The names through which the launcher, Flower's simulation engine and the client actors
agree on the client processes a job keeps from one run to the next (clients/client_actor.py):
a leaf module, so that each side imports the names without importing the others."""

# Set by the launcher for a run on its job's own Ray cluster: the key under which client
# processes are kept from one run to the next.
KEEP_CLIENT_PROCESSES = "BASIN_KEEP_CLIENT_PROCESSES"
# Written into the run's FLWR_HOME when the run started kept client processes: they import
# from the run's app there, so the launcher leaves that folder until the job ends.
KEPT_PROCESSES_STARTED = "kept-client-processes-started"
