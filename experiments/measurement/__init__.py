"""What ``.venv/bin/python -m experiments.benchmark`` and ``experiments.costs`` do once their
arguments are parsed: a Flower run against the bare training loop (flower_overhead.py), many
clients (many_clients.py), a sweep's runs at once (sweep_timing.py), each method's step time
(method_speed.py), a run's start-up by stage (startup_timing.py), and each method's
communication, memory and compute (method_costs.py).
"""
