"""Local objectives: what a client minimises on each batch.

The server's strategy names the objective and its settings in the round config
(``objective`` plus the method's keys, see strategies/methods/objective_server.py); each
objective is declared by its method (``MethodSpec.objective``), and the client builds it
each round (clients/local_round.py). Without a name, clients minimise cross-entropy.
"""
