"""A stock Flower ClientApp but for IMA's client schedule: from t_s on, the round's lr is
IMA's exploration (Basin's ``ima_client_schedule``, the lr Basin's own ClientApp trains with)."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ima_quickstart.task import Net, load_data, train
from strategies import ima_client_schedule

app = ClientApp()


@app.train()
def train_message(msg: Message, context: Context) -> Message:
    config = context.run_config
    schedule = ima_client_schedule(lr=float(config["lr"]), avg_start=int(config["avg-start"]),
                                   local_epochs=int(config["local-epochs"]))
    lr, epochs = schedule(int(msg.content["config"]["server-round"]))  # Flower's FedAvg sends the round
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loader, _ = load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    loss = train(net, loader, epochs, lr)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(loader.dataset), "lr": lr})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)
