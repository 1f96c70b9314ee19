"""The Ray actor that runs a simulation's client work, in a module a client process can
load without Flower's simulation package.

:class:`ClientAppActor` is Flower's ``ClientAppActor`` (``flwr.simulation.ray_transport``),
method for method (``VirtualClientEngineActor.run`` and ``terminate``, and the
``on_actor_init_fn`` hook), defined here so that a client process does not import
``flwr.simulation`` and with it Flower's simulation runner and CLI; the simulation engine
(clients/simulation_engine.py) has Flower's Ray backend build its pool of it, through
clients/flower_internals/, only on a checked Flower release.

On a job's own Ray cluster (experiments/runtime/ray_cluster.py: a job's runs, one after
another) the client processes are kept from one run to the next (:class:`KeptClientActors`):
the first run creates its actors as detached, named ones, a later run of the job takes them
by name. Kept are only processes that run the same sources under the same process-wide
settings (the launcher's key, ``BASIN_KEEP_CLIENT_PROCESSES``) with the same resources;
others are ended first. A kept process serves a new run as it serves another client of its
run, every setting coming with the message, so results are the same bit for bit. It goes on
importing from the app folder of the run that started it, so that run's FLWR_HOME stays
until the job ends (the run marks it, ``KEPT_PROCESSES_STARTED``). The job's cluster ends
them when it stops. What each saves: docs/speed.md.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from flwr.app import Context, Message
from flwr.clientapp.client_app import ClientApp, ClientAppException, LoadClientAppError

from clients.kept_processes import KEEP_CLIENT_PROCESSES, KEPT_PROCESSES_STARTED


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


# Where kept client processes are named (a Ray namespace of the job's cluster).
KEPT_NAMESPACE = "basin-client-processes"


class KeptClientAppActor(ClientAppActor):
    """A :class:`ClientAppActor` that outlives its run: ``terminate`` leaves it for the
    job's next run (its cluster ends it)."""

    def terminate(self) -> None:
        """Stay for the job's next run."""


RemoteKeptClientAppActor = ray.remote(KeptClientAppActor)


class KeptClientActors:
    """What Flower's Ray backend builds its pool of on a job's cluster, in place of the actor
    class: ``options(**resources).remote(**kwargs)``, as the backend calls it, returns the
    job's kept client process of that number and resources, created (detached) where there
    is none. ``key`` names the sources and settings a process may be kept across (see the
    module docstring)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.made = 0

    def options(self, **resources: Any) -> KeptClientActors._Maker:
        return KeptClientActors._Maker(self, resources)

    class _Maker:
        def __init__(self, actors: KeptClientActors, resources: dict[str, Any]) -> None:
            self.actors, self.resources = actors, resources

        def remote(self, **actor_kwargs: Any) -> Any:
            prefix = self.actors.key + "".join(f"-{name}={value}" for name, value in sorted(self.resources.items()))
            if self.actors.made == 0:
                end_other_kept_processes(prefix)
            name = f"{prefix}-{self.actors.made}"
            self.actors.made += 1
            try:
                return ray.get_actor(name, namespace=KEPT_NAMESPACE)
            except ValueError:  # none yet: this run starts it, and its app folder must stay
                (Path(os.environ["FLWR_HOME"]) / KEPT_PROCESSES_STARTED).touch()
            return RemoteKeptClientAppActor.options(
                name=name, namespace=KEPT_NAMESPACE, lifetime="detached", get_if_exists=True, **self.resources,
            ).remote(**actor_kwargs)


def end_other_kept_processes(prefix: str) -> None:
    """End the kept client processes whose names do not start with ``prefix`` (other
    sources, settings or resources), freeing their resources for this run's."""
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == KEPT_NAMESPACE and not entry["name"].startswith(f"{prefix}-"):
            try:
                ray.kill(ray.get_actor(entry["name"], namespace=KEPT_NAMESPACE))
            except ValueError:  # ended meanwhile
                pass


@functools.cache
def actor_class() -> Any:
    """What the engine's Ray backend builds its pool of: the job's kept client processes
    where the launcher names a key and Ray is the job's cluster, else new ones per run."""
    key = os.environ.get(KEEP_CLIENT_PROCESSES)
    if key and os.environ.get("RAY_ADDRESS"):
        return KeptClientActors(key)
    return RemoteClientAppActor
