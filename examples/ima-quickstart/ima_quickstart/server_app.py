"""Flower's FedAvg, wrapped by Basin's IMA: the only lines that differ from a stock ServerApp
are the import and the ``IMA(...)`` around the strategy."""

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from ima_quickstart.task import Net, load_data, test
from strategies import IMA

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    strategy = IMA(FedAvg(fraction_evaluate=0.0), window=int(config["window"]), avg_start=int(config["avg-start"]))
    _, test_loader = load_data(0, 1)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = Net()
        net.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(net, test_loader)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()),
                            num_rounds=int(config["num-server-rounds"]), evaluate_fn=evaluate)
    last = result.evaluate_metrics_serverapp[int(config["num-server-rounds"])]
    print(f"IMA's model after the last round: accuracy {last['accuracy']:.4f}", flush=True)
