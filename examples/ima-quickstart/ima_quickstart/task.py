"""The model, the data and the training loop: a stock Flower quickstart's, on the 8×8 digits
bundled with scikit-learn (no download)."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """A small CNN for 1×8×8 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data(partition_id: int, num_partitions: int, batch_size: int = 32) -> tuple[DataLoader, DataLoader]:
    """This client's share of the digits (every num_partitions-th sample) and the shared test split."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    test = slice(1500, None)
    train = TensorDataset(x[:1500][partition_id::num_partitions], y[:1500][partition_id::num_partitions])
    generator = torch.Generator().manual_seed(partition_id)
    return (DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator),
            DataLoader(TensorDataset(x[test], y[test]), batch_size=256))


def train(net: Net, loader: DataLoader, epochs: int, lr: float) -> float:
    """Local SGD; the mean training loss."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            total, batches = total + float(loss), batches + 1
    return total / max(batches, 1)


def test(net: Net, loader: DataLoader) -> tuple[float, float]:
    """(mean loss, accuracy) on ``loader``."""
    net.eval()
    loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            logits = net(x)
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            count += len(y)
    return loss / count, correct / count
