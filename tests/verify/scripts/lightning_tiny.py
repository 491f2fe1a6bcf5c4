"""A small MLP with dropout trained by Lightning, adopted with the documented one line
(``callbacks=[CyclerCallback()]``), its default logger writing ``lightning_logs/version_N``
in the working directory: what ``cycle verify`` must find IDENTICAL.

    cycle verify tests/verify/scripts/lightning_tiny.py [--every-steps N] [--accumulate 2]
                                                        [--step-seconds S]

``--step-seconds`` (0.05) stands for a real step's compute, a sleep after each batch: without
it a step takes milliseconds, and on a fast machine the 2-device run of 32 steps ended before
verify's first stop landed.
"""

from __future__ import annotations

import argparse
import time
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cycler.integrations.lightning import CyclerCallback


class Classifier(pl.LightningModule):
    def __init__(self, step_seconds: float = 0.0) -> None:
        super().__init__()
        self.step_seconds = step_seconds
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.net(inputs), targets)
        self.log("loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        time.sleep(self.step_seconds)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]


def data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 8, generator=generator)
    return TensorDataset(inputs, (inputs @ torch.randn(8, 4, generator=generator)).argmax(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every-steps", type=int, default=None)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--seeded-loader", action="store_true",
                        help="give the DataLoader a generator of its own")
    parser.add_argument("--in-order", action="store_true", help="a loader without shuffling")
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    pl.seed_everything(0)
    callback = CyclerCallback() if args.every_steps is None else \
        CyclerCallback(every_steps=args.every_steps)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, max_epochs=args.epochs,
                         callbacks=[callback], enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=4,
                         accumulate_grad_batches=args.accumulate)
    generator = torch.Generator().manual_seed(0) if args.seeded_loader else None
    trainer.fit(Classifier(args.step_seconds), DataLoader(data(args.samples), batch_size=8,
                                         shuffle=not args.in_order, generator=generator))


if __name__ == "__main__":
    main()
