"""A small MLP with dropout, trained by Lightning (DDP on 2 gloo ranks, the sampler Lightning
injects) on synthetic data, adopted with one line: ``callbacks=[CyclerCallback()]``.

Usage: lightning_mlp.py --out DIR [--cycler]. Rank 0 writes DIR/final.pt at the end of training;
rank 0 prints "step S" after each step.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cycler.integrations.lightning import CyclerCallback


class Classifier(pl.LightningModule):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))
        self.delay = delay

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        time.sleep(self.delay)
        loss = nn.functional.cross_entropy(self.net(inputs), targets)
        if os.environ.get("DEBUG_STEPS"):
            print(f"dbg {self.global_rank} {self.global_step} {batch_idx} "
                  f"{inputs.sum().item():.6f} {loss.item():.8f}", flush=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_rank == 0:
            print(f"step {self.global_step}", flush=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]


def data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 16, generator=generator)
    return TensorDataset(inputs, (inputs @ torch.randn(16, 4, generator=generator)).argmax(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cycler", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--every-steps", type=int, default=None)
    parser.add_argument("--samples", type=int, default=320)
    args = parser.parse_args()
    warnings.filterwarnings("error", message=".*not resumable")  # Lightning's false warning
    pl.seed_everything(0)
    model = Classifier(args.delay)
    callbacks = [CyclerCallback(every_steps=args.every_steps)] if args.cycler else []
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3,
                         callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(args.out))
    trainer.fit(model, DataLoader(data(args.samples), batch_size=8, shuffle=True))
    if trainer.global_rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out / "final.pt")
        print("training finished", flush=True)


if __name__ == "__main__":
    main()
