"""Basin's analysis tools: the landscapes, decompositions and curvature the model-averaging
papers use to explain why averaging helps, run on saved models of real runs.

One module per tool, each a command ``.venv/bin/python -m experiments.analysis TOOL …`` that reads a
run directory (or a sweep's runs) and writes PNG figures and CSV tables into its
``analysis/`` folder:

- ``landscape`` (landscape.py): loss/error on the plane through three models (IMA Fig 1);
- ``interpolate`` (interpolation.py): 1-D interpolation between two models, e.g. FMA → IMA
  (IMA Figs 5, 7(c));
- ``decompose`` (decomposition.py): IMA's error decomposition: bias terms, locality,
  error vs number of averaged client models, client-model CKA (IMA Figs 2–4);
- ``hessian`` (hessian.py): λ_max, trace, block traces, H_N/H_D across clients and the
  eigen-surface (FedAlign Table 1, Fig 1);
- ``stability`` (stability.py): learning curves with and without averaging (WIMA Figs 1–3).

Runs save what the tools need with ``save-models-every`` (strategies/model_store.py);
``round-indicators`` adds the per-round locality and CKA to ``results.csv``. The package
sits above strategies/, clients/ and partitions/ in the import graph: none of them imports it.
"""
