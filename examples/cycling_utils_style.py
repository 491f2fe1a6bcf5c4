"""The cycling_utils pattern, with only the import line changed.

A script written for cycling_utils keeps working: the same names, the same calls. What changes
is underneath: the sampler no longer replays epoch 0's order every epoch, the saver never deletes
a checkpoint before a newer one is committed, and a torn directory is never loaded.

    cycle run examples/cycling_utils_style.py
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# Before: from cycling_utils import AtomicDirectory, InterruptableDistributedSampler, ...
from cycler import (
    AtomicDirectory,
    InterruptableDistributedSampler,
    MetricsTracker,
    TimestampedTimer,
    atomic_torch_save,
)

EPOCHS = 3
SAVE_EVERY = 50

timer = TimestampedTimer("start")
output_directory = os.environ.get("CHECKPOINT_ARTIFACT_PATH") or os.environ.get(
    "CYCLER_CHECKPOINT_DIR", "checkpoints"
)
torch.manual_seed(0)
dataset = TensorDataset(torch.randn(2048, 16), torch.randint(0, 2, (2048,)))
model = nn.Linear(16, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
sampler = InterruptableDistributedSampler(dataset, num_replicas=1, rank=0, seed=0)
loader = DataLoader(dataset, batch_size=16, sampler=sampler)
metrics = MetricsTracker()
saver = AtomicDirectory(output_directory, is_master=True)

latest_symlink = os.path.join(output_directory, saver.symlink_name)
start_epoch = 0
if os.path.exists(latest_symlink):
    checkpoint = torch.load(os.path.join(os.readlink(latest_symlink), "checkpoint.pt"),
                            weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    sampler.load_state_dict(checkpoint["sampler"])
    metrics.load_state_dict(checkpoint["metrics"])
    start_epoch = checkpoint["epoch"]
    timer.report(f"resumed from {os.readlink(latest_symlink)}")

for epoch in range(start_epoch, EPOCHS):
    with sampler.in_epoch(epoch):
        for step, (inputs, targets) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sampler.advance(len(inputs))
            metrics.update(loss=loss.item(), batches=1)
            if step % SAVE_EVERY == 0:
                checkpoint_directory = saver.prepare_checkpoint_directory()
                atomic_torch_save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "sampler": sampler.state_dict(), "metrics": metrics.reduce().state_dict(),
                     "epoch": epoch},
                    os.path.join(checkpoint_directory, "checkpoint.pt"),
                )
                saver.symlink_latest(checkpoint_directory)
    metrics.reduce().end_epoch()
    timer.report(f"epoch {epoch}: loss {metrics.epoch_reports[-1]['loss']:.3f}")
