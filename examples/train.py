"""A small model on synthetic data, trained with every part of cycler, resuming exactly.

Run it under the supervisor (one or more ranks)::

    cycle run examples/train.py
    cycle run --nproc-per-node 2 examples/train.py --epochs 3

Stop it at any moment (Ctrl-C, SIGTERM, Slurm preemption): it checkpoints at a step every rank
agrees on and exits; run the same command again and it continues from that checkpoint, ending
with weights bit-identical to a run that was never stopped. It also runs without ``cycle run``
(``python examples/train.py``), checkpointing only every ``--checkpoint-every`` steps.

On GPUs (``--device cuda``: each rank on the GPU numbered by its ``LOCAL_RANK``, modulo their
count; NCCL unless ``--backend`` says otherwise, e.g. ``cpu:gloo,cuda:nccl``, which also makes
a group of one rank) a resume is bit-identical only with deterministic
kernels: the script sets ``torch.use_deterministic_algorithms(True)`` and
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS reads it when it starts) for that.

``--compile`` runs the model through ``torch.compile``; under ``cycle run`` its compiled code
is kept for the next start on this node and carried with the checkpoint root to the next node
(docs/compile-cache.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from cycler import (
    AtomicDirectory,
    EpochLoop,
    InterruptableDistributedSampler,
    MetricsTracker,
    StepControl,
    atomic_torch_save,
    capture_rng_state,
    default_checkpoint_root,
    restore_rng_state,
    settle_ddp_buckets,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--samples", type=int, default=65536, help="synthetic dataset size")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--checkpoint-every", type=int, default=200, help="steps (0: never)")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="extra seconds per step, to make a short run last longer")
    parser.add_argument("--final-weights", type=Path, default=None,
                        help="where rank 0 writes the final model weights")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: each rank on the GPU numbered by its LOCAL_RANK")
    parser.add_argument("--backend", default=None,
                        help="process group backend, given: a group even of one rank "
                        "(default: gloo on cpu, nccl on cuda, with several ranks)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model (its caches survive restarts under "
                        "cycle run)")
    return parser.parse_args()


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    """A fixed classification problem: the same tensors on every rank and every restart."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 32, generator=generator)
    teacher = torch.randn(32, 4, generator=generator)
    targets = (inputs @ teacher + 0.1 * torch.randn(samples, 4, generator=generator)).argmax(1)
    return TensorDataset(inputs, targets)


def make_model(hidden: int) -> nn.Module:
    # Dropout draws from torch's global generator, so exact resume needs the RNG state too.
    return nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 4))


class Trainer:
    """Everything that must survive a restart, and how to save and load it."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args = args
        self.device = device
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        model = make_model(args.hidden).to(device)
        ids = None if device.type == "cpu" else [device]
        self.model = model
        if dist.is_initialized():
            self.model = DistributedDataParallel(model, device_ids=ids)
            # The same gradient buckets from the first step on, on every start: with 3+ ranks a
            # resumed step then all-reduces in the order the uninterrupted run's step did.
            settle_ddp_buckets(self.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        # Compiled calls go through the wrapper; the checkpoint keeps the plain model's names.
        self.forward = torch.compile(self.model) if args.compile else self.model
        self.compiled_once = not args.compile
        dataset = synthetic_dataset(args.samples, args.seed)
        self.sampler = InterruptableDistributedSampler(dataset, shuffle=True, seed=args.seed)
        # A private generator for the loader: iter() then draws nothing from the global RNG,
        # whose state is part of the checkpoint.
        self.loader = DataLoader(dataset, batch_size=args.batch_size, sampler=self.sampler,
                                 num_workers=args.workers,
                                 generator=torch.Generator().manual_seed(args.seed))
        self.epochs = EpochLoop()
        self.metrics = MetricsTracker()
        self.control = StepControl(every_steps=args.checkpoint_every or None)
        self.saver = AtomicDirectory(default_checkpoint_root(), keep_last=3)

    def resume(self) -> None:
        latest = self.saver.latest_checkpoint()
        if latest is None:
            return
        # On the CPU: random states must be CPU tensors; load_state_dict moves the rest.
        shared = torch.load(Path(latest) / "train.pt", weights_only=True, map_location="cpu")
        own = torch.load(Path(latest) / f"rank-{self.rank}.pt", weights_only=True,
                         map_location="cpu")
        self.model.load_state_dict(shared["model"])
        self.optimizer.load_state_dict(shared["optimizer"])
        self.sampler.load_state_dict(shared["sampler"])
        self.epochs.load_state_dict(shared["epochs"])
        self.control.load_state_dict(shared["control"])
        self.metrics.load_state_dict(own["metrics"])
        restore_rng_state(own["rng"])
        log(f"resumed from {Path(latest).name} at step {self.control.global_step}")

    def save(self) -> None:
        directory = Path(self.saver.prepare_checkpoint_directory())
        if self.rank == 0:
            atomic_torch_save({
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "sampler": self.sampler.state_dict(), "epochs": self.epochs.state_dict(),
                "control": self.control.state_dict(),
            }, directory / "train.pt")
        # reduce() first: a state keeps only the reduced sums (per-rank sums differ by rank).
        atomic_torch_save({"metrics": self.metrics.reduce().state_dict(),
                           "rng": capture_rng_state()},
                          directory / f"rank-{self.rank}.pt")
        step, epoch = self.control.global_step, self.epochs.current_epoch()
        self.saver.symlink_latest(directory, metadata={"step": step, "epoch": epoch})
        log(f"checkpoint {directory.name} committed at step {step}")

    def train(self) -> bool:
        """Train to the end (True) or until a stop is agreed (False)."""
        log(f"training from step {self.control.global_step}")
        for epoch in self.epochs.remaining_epochs_until(self.args.epochs):
            with self.sampler.in_epoch(epoch):
                if not self.train_epoch():
                    return False
            loss = self.metrics.reduce().agg
            log(f"epoch {epoch} done: mean loss {loss['loss'] / max(loss['batches'], 1):.4f}")
            self.metrics.end_epoch()
        return True

    def train_epoch(self) -> bool:
        self.model.train()
        for inputs, targets in self.loader:
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            # The first compiled step compiles: marked, so cycle status counts it apart.
            with contextlib.nullcontext() if self.compiled_once \
                    else self.control.paused("compile"):
                loss = nn.functional.cross_entropy(self.forward(inputs), targets)
                self.optimizer.zero_grad()
                loss.backward()
            self.compiled_once = True
            self.optimizer.step()
            self.sampler.advance(len(inputs))
            self.metrics.update(loss=loss.item(), batches=1)
            if self.args.step_delay:
                time.sleep(self.args.step_delay)
            decision = self.control.step()
            if decision.checkpoint:
                self.save()
            if decision.stop:
                log(f"stopping at step {decision.step}: {decision.reason}")
                return False
        return True

    def final_weights(self) -> dict[str, Any]:
        model = self.model.module if isinstance(self.model, DistributedDataParallel) else self.model
        return model.state_dict()


def log(message: str) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print(f"[train] {message}", flush=True)


def on_device(args: argparse.Namespace) -> torch.device:
    """This rank's device, made deterministic on a GPU (before any CUDA work)."""
    if args.device == "cpu":
        return torch.device("cpu")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def main() -> None:
    args = parse_args()
    device = on_device(args)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or args.backend:
        dist.init_process_group(args.backend or ("gloo" if device.type == "cpu" else "nccl"))
    trainer = Trainer(args, device)
    trainer.resume()
    finished = trainer.train()
    trainer.control.close()  # every rank: the exchange in flight and the saves are waited for
    if finished and args.final_weights is not None and trainer.rank == 0:
        atomic_torch_save(trainer.final_weights(), args.final_weights)
    if finished:
        log("training finished")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
