"""The machinery behind Basin's command-line tools (experiments/*.py) and its Python API
(experiments/api.py): launching and following a Flower run, its processes and guardian,
output folders and locks, progress, machine and data checks, MPS, the Ray cluster, config
layering, and the implementations the tools import once their arguments are parsed.
Internals: nothing here is a command to type.
"""
