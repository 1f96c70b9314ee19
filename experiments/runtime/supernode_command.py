"""``.venv/bin/python -m experiments.runtime.supernode_command ARGS``: Flower's
``flower-supernode ARGS`` as a local federation (experiments/runtime/deployment.py) starts
each of its nodes, its waits for the next message and for a ClientApp's reply each at most
:data:`POLL_SECONDS` instead of Flower's 3 s and 0.5 s
(``clients.flower_internals.cap_supernode_waits``; a 2-node federation's rounds on 2 cores
1.3-2.2 s instead of 3.3-5.4 s). With the speed-ups off, or on a Flower release they were
not checked against, this is Flower's own SuperNode."""

from __future__ import annotations

import sys

from clients import flower_internals

# A SuperNode asks its SuperLink for a message this often while it has none: 5 requests a
# second per node, for the few nodes one machine holds (8 nodes on 2 cores: their SuperLink
# and SuperNodes took 31 CPU-seconds in a 51-s run instead of 27, the rounds no faster).
POLL_SECONDS = 0.2

if __name__ == "__main__":
    from flwr.supernode.cli import flower_supernode

    flower_internals.cap_supernode_waits(POLL_SECONDS)
    sys.argv[0] = "flower-supernode"
    sys.exit(flower_supernode())
