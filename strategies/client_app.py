"""The ClientApp of a Basin run (pyproject.toml's ``clientapp``): clients/handlers.py's
handlers, with every method's client half handed over from the registry above both halves
(clients/halves.py).

The handlers are defined here, not only imported: Flower's simulation loads the ClientApp
once and ships it to each client process (Ray), where its handlers are found by module and
name; the handlers that train hand the client halves over (importing this module changes
nothing). The registry, and with it torch, is imported only when a client first trains,
so Flower's simulation process loads this module as quickly as before.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients import handlers as basin_client
from clients import protocol
from clients.halves import ClientHalves, provide

app = ClientApp()


def _client_halves() -> ClientHalves:
    from strategies.methods.registry import client_halves

    return client_halves()



@app.query()
def query(msg: Message, context: Context) -> Message:
    return basin_client.query(msg, context)


@app.query(protocol.FULL_GRADIENT_ACTION)
def full_gradient_query(msg: Message, context: Context) -> Message:
    provide(_client_halves)
    return basin_client.full_gradient_query(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    provide(_client_halves)  # the same loader each message: what it gave is kept
    return basin_client.train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    provide(_client_halves)  # a plug-in model is built by its client half
    return basin_client.evaluate(msg, context)
