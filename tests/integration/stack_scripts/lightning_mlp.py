"""A small MLP with dropout, trained by Lightning (DDP on 2 gloo ranks) on synthetic data,
adopted with one line: ``callbacks=[CyclerCallback()]``.

Usage: lightning_mlp.py --out DIR [--cycler] [configuration options]. Rank 0 writes DIR/final.pt
at the end of training; rank 0 prints "step S" (the global step) after each training batch.

The configurations the integration is tested on: ``--accumulate N`` and ``--clip V``
(Lightning's own accumulation and clipping); ``--manual`` (manual optimization, two optimizers,
each stepped every second batch, its gradients accumulated in between); ``--data`` the loader:
``map`` (a map-style dataset, the sampler Lightning injects), ``stream`` (an IterableDataset
with ``state_dict``/``load_state_dict``, read in the training process), ``torchdata`` (the same
stream through torchdata's StatefulDataLoader with one worker), ``plain-stream`` (an
IterableDataset with no state).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from cycler.integrations.lightning import CyclerCallback

BATCH = 8


class Classifier(pl.LightningModule):
    def __init__(self, delay: float, manual: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))
        self.delay = delay
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        time.sleep(self.delay)
        loss = nn.functional.cross_entropy(self.net(inputs), targets)
        if self.automatic_optimization:
            return loss
        self.manual_backward(loss / 2)
        if batch_idx % 2 == 1:  # an accumulated step of both optimizers every second batch
            for optimizer in self.optimizers():
                optimizer.step()
                optimizer.zero_grad()
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(inputs), targets),
                 sync_dist=True)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_rank == 0:
            print(f"step {self.global_step}", flush=True)

    def configure_optimizers(self):
        first, second = self.net[0], self.net[3]
        if not self.automatic_optimization:
            return [torch.optim.SGD(first.parameters(), lr=0.05, momentum=0.9),
                    torch.optim.Adam(second.parameters(), lr=1e-3)]
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]


def data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 16, generator=generator)
    return TensorDataset(inputs, (inputs @ torch.randn(16, 4, generator=generator)).argmax(1))


class Stream(IterableDataset):
    """Each rank's share of the samples, in a new order every pass; its position is
    ``state_dict()``. Without ``stateful`` it has none (the class below)."""

    def __init__(self, samples: int) -> None:
        self.samples = data(samples)
        self.passes, self.position = 0, 0

    def _share(self) -> list[int]:
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        order = torch.randperm(len(self.samples), generator=torch.Generator().manual_seed(
            self.passes)).tolist()
        return order[rank::world]

    def __len__(self) -> int:
        return len(self._share())

    def __iter__(self):
        share = self._share()
        while self.position < len(share):
            self.position += 1
            yield self.samples[share[self.position - 1]]
        self.passes, self.position = self.passes + 1, 0


class StatefulStream(Stream):
    def state_dict(self) -> dict[str, int]:
        return {"passes": self.passes, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.passes, self.position = state["passes"], state["position"]


def loader(kind: str, samples: int) -> DataLoader:
    if kind == "map":
        return DataLoader(data(samples), batch_size=BATCH, shuffle=True)
    if kind == "torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(StatefulStream(samples), batch_size=BATCH, num_workers=1)
    stream = StatefulStream(samples) if kind == "stream" else Stream(samples)
    return DataLoader(stream, batch_size=BATCH)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cycler", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--every-steps", default=None,
                        help="CyclerCallback's every_steps (a number, or 'auto'); "
                             "not given: the callback's default")
    parser.add_argument("--samples", type=int, default=320)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--manual", action="store_true")
    parser.add_argument("--val-check-interval", type=float, default=None,
                        help="validate on shuffled data this often (a fraction of an epoch)")
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--limit-train-batches", type=int, default=None)
    parser.add_argument("--data", default="map",
                        choices=["map", "stream", "torchdata", "plain-stream"])
    args = parser.parse_args()
    warnings.filterwarnings("error", message=".*not resumable")  # Lightning's false warning
    pl.seed_everything(0)
    model = Classifier(args.delay, args.manual)
    callbacks = []
    if args.cycler:
        every = args.every_steps
        callbacks.append(CyclerCallback() if every is None else CyclerCallback(
            every_steps=every if every == "auto" else int(every)))
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "2"))  # cycle run --nproc-per-node
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp", max_epochs=args.epochs,
                         callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(args.out),
                         accumulate_grad_batches=args.accumulate, gradient_clip_val=args.clip,
                         max_steps=args.max_steps, limit_train_batches=args.limit_train_batches,
                         val_check_interval=args.val_check_interval,
                         limit_val_batches=None if args.val_check_interval else 0)
    validation = DataLoader(data(64), batch_size=BATCH, shuffle=True) \
        if args.val_check_interval else None
    trainer.fit(model, loader(args.data, args.samples), validation)
    if trainer.global_rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out / "final.pt")
        print(f"training finished pid {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
