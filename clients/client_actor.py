"""The Ray actor that runs a simulation's client work, in a module a client process can
load without Flower's simulation package.

Flower 1.41's ``ClientAppActor`` lives in ``flwr.simulation.ray_transport.ray_actor``:
a client process that receives it imports ``flwr.simulation``, whose ``__init__``
imports Flower's simulation runner and CLI, 1.3 s of CPU in each client process on 2
cores (the ClientApp's own imports take 0.3 s). :class:`ClientAppActor` is the same
actor, method for method (``VirtualClientEngineActor.run`` and ``terminate``, and the
``on_actor_init_fn`` hook), defined here; the simulation engine
(clients/simulation_engine.py) has Flower's Ray backend build its pool of it, through
``clients/flower_internals.py``, only where that backend is 1.41.0's.
"""

from __future__ import annotations

from collections.abc import Callable

import ray
from flwr.app import Context, Message
from flwr.clientapp.client_app import ClientApp, ClientAppException, LoadClientAppError


class ClientAppActor:
    """Runs ClientApps on the messages Flower's Ray backend hands it (its ``run``); Ray
    runs it as :data:`RemoteClientAppActor`. Named as Flower's, so that a client process
    is still ``ray::ClientAppActor`` in ``ps`` and Ray's state API."""

    def __init__(self, on_actor_init_fn: Callable[[], None] | None = None) -> None:
        if on_actor_init_fn:
            on_actor_init_fn()

    def terminate(self) -> None:
        """End this actor's process."""
        ray.actor.exit_actor()

    def run(self, client_app_fn: Callable[[], ClientApp], message: Message, cid: str,
            context: Context) -> tuple[str, Message, Context]:
        """(``cid``, the ClientApp's reply to ``message``, its updated ``context``)."""
        try:
            app = client_app_fn()
            out_message = app(message=message, context=context)
        except LoadClientAppError:
            raise
        except Exception as error:
            raise ClientAppException(str(error)) from error
        return cid, out_message, context


# The Ray actor class that RayBackend.build makes its pool of.
RemoteClientAppActor = ray.remote(ClientAppActor)
