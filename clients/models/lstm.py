"""The character LSTM of next-character prediction on Shakespeare (WIMA's FedJAX model).

FedJAX's ``fedjax.models.shakespeare.create_lstm_model`` (McMahan et al. 2017's model):
an 8-dimensional character embedding, two LSTM layers of 256 units (FedJAX applies tanh
to each layer's output), a linear layer to the vocabulary at every position. Inputs are
(N, T) character ids; outputs are (N, vocabulary, T), classes in dimension 1 as PyTorch's
cross-entropy expects, so the loss, the accuracy and every gradient-based method treat
the T positions as T predictions (targets (N, T); padding IGNORE_INDEX is skipped).
"""

from __future__ import annotations

import torch
from torch import nn


class CharLstm(nn.Module):
    """Embedding(V, 8) → 2 × (LSTM(256), tanh) → Linear(256, V) per position."""

    def __init__(self, vocabulary: int, embedding: int = 8, hidden: int = 256, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, embedding)
        self.lstms = nn.ModuleList(nn.LSTM(embedding if i == 0 else hidden, hidden, batch_first=True) for i in range(layers))
        self.classifier = nn.Linear(hidden, vocabulary)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, hidden): the last layer's output at every position."""
        h = self.embed(x)
        for lstm in self.lstms:
            h = torch.tanh(lstm(h)[0])
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.represent(x)).transpose(1, 2)
