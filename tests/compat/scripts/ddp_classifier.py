"""A DDP classifier written the cycling_utils way; only the import line names cycler.

The idioms of the ISC demos, written anew: the run resumes by reading the latest symlink,
derives the batch from `sampler.progress // batch_size`, takes the end-of-epoch branch when
`batch + 1 == len(train_dataloader)` (epoch scheduler step, metric reduction, a save), sizes its
per-batch scheduler with `epochs * len(train_dataloader)`, saves with `atomic_torch_save` on rank
0 into `AtomicDirectory` checkpoints under `$CHECKPOINT_ARTIFACT_PATH`, and logs with
`TimestampedTimer` and `MetricsTracker`. It installs no signal handler and never reads a control
file.

    cycle run --nproc-per-node 2 ddp_classifier.py --final-weights final.pt
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

# from cycling_utils import (AtomicDirectory, InterruptableDistributedSampler, MetricsTracker,
#                            TimestampedTimer, atomic_torch_save)
from cycler import (
    AtomicDirectory,
    InterruptableDistributedSampler,
    MetricsTracker,
    TimestampedTimer,
    atomic_torch_save,
)

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=1536)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--save-every", type=int, default=10)
parser.add_argument("--batch-delay", type=float, default=0.0)  # a heavier model, simulated
parser.add_argument("--final-weights", default=None)
args = parser.parse_args()

timer = TimestampedTimer("Imported")
dist.init_process_group("gloo")
rank = int(os.environ["RANK"])
output_directory = os.environ["CHECKPOINT_ARTIFACT_PATH"]

torch.manual_seed(0)
images = torch.randn(args.samples, 1, 12, 12)
labels = (images.mean(dim=(1, 2, 3)) > 0).long() + 2 * (images[:, 0, 0, 0] > 0).long()
train_dataset = TensorDataset(images, labels)
model = DDP(nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
    nn.Flatten(), nn.Linear(64, 4),
))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
train_sampler = InterruptableDistributedSampler(train_dataset)
train_dataloader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
batch_scheduler = torch.optim.lr_scheduler.OneCycleLR(
    optimizer, max_lr=0.1, total_steps=args.epochs * len(train_dataloader))
epoch_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
metrics = MetricsTracker()
saver = AtomicDirectory(output_directory=output_directory, is_master=rank == 0)
timer.report("Setup complete")

latest_symlink_file_path = os.path.join(output_directory, saver.symlink_name)
if os.path.islink(latest_symlink_file_path):
    latest_checkpoint_path = os.readlink(latest_symlink_file_path)
    checkpoint = torch.load(os.path.join(latest_checkpoint_path, "checkpoint.pt"),
                            map_location="cpu", weights_only=True)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    batch_scheduler.load_state_dict(checkpoint["batch_scheduler"])
    epoch_scheduler.load_state_dict(checkpoint["epoch_scheduler"])
    train_sampler.load_state_dict(checkpoint["train_sampler"])
    metrics.load_state_dict(checkpoint["metrics"])
    timer.report(f"Resumed from {latest_checkpoint_path}")

for epoch in range(train_sampler.epoch, args.epochs):
    train_sampler.set_epoch(epoch)
    model.train()
    for inputs, targets in train_dataloader:
        batch = train_sampler.progress // train_dataloader.batch_size
        is_last_batch = (batch + 1) == len(train_dataloader)
        is_save_batch = ((batch + 1) % args.save_every == 0) or is_last_batch

        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_scheduler.step()
        time.sleep(args.batch_delay)
        train_sampler.advance(len(inputs))
        metrics.update({"examples_seen": len(inputs), "loss": loss.item() * len(inputs)})

        if is_last_batch:
            epoch_scheduler.step()
            metrics.reduce()
            seen = metrics.local["examples_seen"]
            timer.report(f"Epoch {epoch} [{batch + 1}/{len(train_dataloader)}] "
                         f"loss {metrics.local['loss'] / seen:.4f} over {seen:.0f} examples")
            metrics.end_epoch()

        if is_save_batch:
            checkpoint_directory = saver.prepare_checkpoint_directory()
            if rank == 0:
                atomic_torch_save({
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "batch_scheduler": batch_scheduler.state_dict(),
                    "epoch_scheduler": epoch_scheduler.state_dict(),
                    "train_sampler": train_sampler.state_dict(),
                    "metrics": metrics.state_dict(),
                }, os.path.join(checkpoint_directory, "checkpoint.pt"))
            saver.symlink_latest(checkpoint_directory)
    train_sampler.reset_progress()

if rank == 0 and args.final_weights:
    atomic_torch_save(model.module.state_dict(), args.final_weights)
dist.destroy_process_group()
