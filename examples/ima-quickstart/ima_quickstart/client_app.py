"""A stock Flower ClientApp: it trains what it receives and knows nothing of IMA."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ima_quickstart.task import Net, load_data, train

app = ClientApp()


@app.train()
def train_message(msg: Message, context: Context) -> Message:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loader, _ = load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    loss = train(net, loader, int(context.run_config["local-epochs"]), float(context.run_config["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(loader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)
