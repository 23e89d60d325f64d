"""The small model and synthetic data of the DDP test and benchmark."""

from __future__ import annotations

import torch
from torch import nn


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def batches(rank: int, steps: int, batch: int = 32):
    g = torch.Generator().manual_seed(1000 + rank)
    for _ in range(steps):
        x = torch.randn(batch, 64, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        yield x, y


def train(ddp: nn.Module, rank: int, steps: int) -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in batches(rank, steps):
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
