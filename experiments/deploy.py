"""Run Basin on Flower's Deployment Engine on this machine.

    python -m experiments.deploy --set num-rounds=5            # insecure
    python -m experiments.deploy --tls --set num-rounds=5      # TLS
    python -m experiments.deploy --auth --set num-rounds=5     # TLS + SuperNode authentication

Unlike ``experiments.run`` (the Simulation Engine: one process, clients as Ray actors),
this starts a real ``flower-superlink`` and one ``flower-supernode`` per client, each a
separate process talking HTTP(S) over localhost, exactly as they would on separate
machines; then ``flwr run APP_DIR <federation> --stream`` submits the run to that
SuperLink. SuperNode ``K`` holds partition ``K`` of ``num-clients``
(``--node-config "partition-id=K num-partitions=N"``); the ServerApp asks every node for
its partition id before the first round, so cohorts, aggregation order and therefore the
results are the same as in simulation. The same holds bit for bit because each
SuperNode's ClientApp gets as many CPU threads as Ray gives a simulated client
(``--cpus-per-client``, default 1; see ``LocalFederation._supernode_env``).

Security modes:

* insecure: plain HTTP (``--insecure`` everywhere).
* ``--tls``: a throw-away CA and a server certificate for 127.0.0.1/localhost
  (experiments/certificates.py); the SuperLink serves with it, SuperNodes and the
  ``flwr`` CLI trust the CA (``--root-certificates``; ``root-certificates`` in the
  federation entry).
* ``--auth`` (implies ``--tls``; Flower requires TLS for it): the SuperLink only admits
  SuperNodes whose public key was registered with ``flwr supernode register`` before
  they connect; each SuperNode signs its requests with its own ECDSA key.

Data: the default ``digits`` dataset ships with scikit-learn, so SuperNodes need nothing
else. For file datasets (``dataset = "fashion-mnist"`` …) the run-config key ``data-dir``
is read on every SuperNode's machine (and the SuperLink's, for the server's test set):
in a real deployment each machine needs the data at that path.

Everything started here lives under a temporary directory (a ``FLWR_HOME`` per process,
certificates, keys, the SuperLink's database) and is stopped by PID, whole process
trees, when the run ends or fails. Logs go to the output directory:
``superlink.log``, ``supernode-K.log`` and ``flwr.log`` (the ``flwr run`` stream).
"""

from __future__ import annotations

import argparse

from experiments.runtime.cli import add_verbosity_options, apply_verbosity, exit_command, guarded, nonempty_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="a preset name from experiments/presets/ or a TOML file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key")
    parser.add_argument("--tls", action="store_true", help="TLS with a throw-away CA for 127.0.0.1/localhost")
    parser.add_argument("--auth", action="store_true", help="SuperNode authentication (implies --tls)")
    parser.add_argument("--out", type=nonempty_path, help="output directory (default runs/deploy-<preset>-<time>)")
    parser.add_argument("--cpus-per-client", type=float, default=1.0,
                        help="CPU threads per SuperNode's ClientApp (as in simulation; default 1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of a run with another config in --out (without it: refused, naming the keys)")
    add_verbosity_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_verbosity(args)
    # The implementation imports torch and Flower: only once the arguments parsed.
    from experiments.runtime.deployment import run_command

    return guarded(lambda: run_command(args))


if __name__ == "__main__":
    exit_command(main())
