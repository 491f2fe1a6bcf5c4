"""A small next-token model on a streamed, sharded token dataset, resuming exactly.

The data is an ``IterableDataset`` (a stand-in for token shards on disk) read through
torchdata's ``StatefulDataLoader`` with worker processes. Each rank saves its loader's
``state_dict()`` (which holds every worker's position in its shards) through cycler's saver next
to the model, and restores it on resume: the run continues with the very next batch.

    pip install 'torch-cycler[data]'
    cycle run --nproc-per-node 2 examples/streaming_train.py

Stop it at any moment; run the same command again and it continues from the last checkpoint,
ending with weights bit-identical to a run that was never stopped. ``--batch-log DIR`` makes
each rank append the ids of the samples in every batch it trains on to ``DIR/rank-R.log``
(a ``start STEP`` line at each start, then ``STEP ID ID ...`` per batch).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from cycler import (
    AtomicDirectory,
    EpochLoop,
    StepControl,
    atomic_torch_save,
    capture_rng_state,
    default_checkpoint_root,
    restore_rng_state,
)

# torchdata 0.11 warns at every iter() about an API torch deprecated; nothing to act on here.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shards", type=int, default=32, help="token shards in the corpus")
    parser.add_argument("--sequences-per-shard", type=int, default=256)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps (0: never)")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="extra seconds per step, to make a short run last longer")
    parser.add_argument("--final-weights", type=Path, default=None,
                        help="where rank 0 writes the final model weights")
    parser.add_argument("--batch-log", type=Path, default=None,
                        help="directory where each rank logs the sample ids of its batches")
    return parser.parse_args()


class TokenShards(IterableDataset[dict[str, torch.Tensor]]):
    """Synthetic token shards, split over ranks and loader workers, resumable per worker.

    Reader ``rank * workers + worker`` of ``world_size * workers`` reads the shards whose number
    is its own modulo the reader count, in order; inside a shard the sequences come in an order
    drawn from ``(seed, epoch, shard)``. A sequence's tokens depend only on its id. Inside each
    worker, ``state_dict()`` is the worker's position: StatefulDataLoader snapshots it.
    """

    def __init__(self, args: argparse.Namespace, rank: int, world_size: int) -> None:
        self.shards, self.per_shard = args.shards, args.sequences_per_shard
        self.length, self.vocab, self.seed = args.sequence_length, args.vocab, args.seed
        self.rank, self.world_size = rank, world_size
        readers = world_size * max(args.workers, 1)
        if self.shards % readers:
            raise SystemExit(f"--shards {self.shards} must be a multiple of the {readers} readers "
                             "(ranks x workers): every rank must take the same number of steps")
        self.epoch, self.shard_cursor, self.sequence_cursor = 0, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.shard_cursor, self.sequence_cursor = epoch, 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "shard_cursor": self.shard_cursor,
                "sequence_cursor": self.sequence_cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = state["epoch"]
        self.shard_cursor, self.sequence_cursor = state["shard_cursor"], state["sequence_cursor"]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        shards = self._my_shards()
        while self.shard_cursor < len(shards):
            order = self._sequence_order(shards[self.shard_cursor])
            while self.sequence_cursor < len(order):
                sample_id = shards[self.shard_cursor] * self.per_shard + order[self.sequence_cursor]
                self.sequence_cursor += 1
                yield {"id": torch.tensor(sample_id), "tokens": self._tokens(sample_id)}
            self.shard_cursor, self.sequence_cursor = self.shard_cursor + 1, 0

    def _my_shards(self) -> list[int]:
        worker = get_worker_info()
        workers, worker_id = (1, 0) if worker is None else (worker.num_workers, worker.id)
        reader, readers = self.rank * workers + worker_id, self.world_size * workers
        return list(range(reader, self.shards, readers))

    def _sequence_order(self, shard: int) -> list[int]:
        key = (self.seed * 1_000_003 + self.epoch) * 1_000_003 + shard
        generator = torch.Generator().manual_seed(key)
        return torch.randperm(self.per_shard, generator=generator).tolist()

    def _tokens(self, sample_id: int) -> torch.Tensor:
        # A learnable stream: each sequence counts up by its own stride from its own start.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + sample_id)
        start, stride = torch.randint(0, self.vocab, (2,), generator=generator).tolist()
        return (start + stride * torch.arange(self.length + 1)) % self.vocab


def make_model(vocab: int, hidden: int) -> nn.Module:
    # Dropout draws from torch's global generator, so exact resume needs the RNG state too.
    return nn.Sequential(nn.Embedding(vocab, hidden), nn.Dropout(0.1), nn.Linear(hidden, vocab))


class Trainer:
    """Everything that must survive a restart, and how to save and load it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        world_size = dist.get_world_size() if dist.is_initialized() else 1
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        model = make_model(args.vocab, args.hidden)
        self.model = DistributedDataParallel(model) if dist.is_initialized() else model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.dataset = TokenShards(args, self.rank, world_size)
        # A private generator: iter() then draws nothing from the global RNG (checkpointed).
        self.loader = StatefulDataLoader(self.dataset, batch_size=args.batch_size,
                                         num_workers=args.workers,
                                         generator=torch.Generator().manual_seed(args.seed))
        self.epochs = EpochLoop()
        self.control = StepControl(every_steps=args.checkpoint_every or None)
        self.saver = AtomicDirectory(default_checkpoint_root(), keep_last=3)
        self.batch_log = _open_batch_log(args.batch_log, self.rank)

    def resume(self) -> None:
        latest = self.saver.latest_checkpoint()
        if latest is not None:
            shared = torch.load(Path(latest) / "train.pt", weights_only=True)
            own = torch.load(Path(latest) / f"rank-{self.rank}.pt", weights_only=True)
            self.model.load_state_dict(shared["model"])
            self.optimizer.load_state_dict(shared["optimizer"])
            self.epochs.load_state_dict(shared["epochs"])
            self.control.load_state_dict(shared["control"])
            # Each worker's place in its shards: the next iter() restores it in the workers.
            self.loader.load_state_dict(own["loader"])
            restore_rng_state(own["rng"])
            log(f"resumed from {Path(latest).name} at step {self.control.global_step}")
        self._log_batch(f"start {self.control.global_step}")

    def save(self) -> None:
        directory = Path(self.saver.prepare_checkpoint_directory())
        if self.rank == 0:
            atomic_torch_save({
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "epochs": self.epochs.state_dict(), "control": self.control.state_dict(),
            }, directory / "train.pt")
        # The loader's state is per rank: every rank reads its own shards.
        atomic_torch_save({"loader": self.loader.state_dict(), "rng": capture_rng_state()},
                          directory / f"rank-{self.rank}.pt")
        step, epoch = self.control.global_step, self.epochs.current_epoch()
        self.saver.symlink_latest(directory, metadata={"step": step, "epoch": epoch})
        log(f"checkpoint {directory.name} committed at step {step}")

    def train(self) -> bool:
        """Train to the end (True) or until a stop is agreed (False)."""
        log(f"training from step {self.control.global_step}")
        for epoch in self.epochs.remaining_epochs_until(self.args.epochs):
            self.dataset.set_epoch(epoch)  # a loaded loader state overrides it in the workers
            if not self.train_epoch():
                return False
            log(f"epoch {epoch} done")
        return True

    def train_epoch(self) -> bool:
        self.model.train()
        for batch in self.loader:
            tokens = batch["tokens"]
            logits = self.model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if self.args.step_delay:
                time.sleep(self.args.step_delay)
            decision = self.control.step()
            self._log_batch(f"{decision.step} {' '.join(map(str, batch['id'].tolist()))}")
            if decision.checkpoint:
                self.save()
            if decision.stop:
                log(f"stopping at step {decision.step}: {decision.reason}")
                return False
        return True

    def final_weights(self) -> dict[str, Any]:
        model = self.model.module if isinstance(self.model, DistributedDataParallel) else self.model
        return model.state_dict()

    def _log_batch(self, line: str) -> None:
        if self.batch_log is not None:
            self.batch_log.write(line + "\n")
            self.batch_log.flush()


def _open_batch_log(directory: Path | None, rank: int) -> TextIO | None:
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    return (directory / f"rank-{rank}.log").open("a")


def log(message: str) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print(f"[train] {message}", flush=True)


def main() -> None:
    args = parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")  # CPU tensors: gloo on every machine
    trainer = Trainer(args)
    trainer.resume()
    finished = trainer.train()
    if finished and args.final_weights is not None and trainer.rank == 0:
        atomic_torch_save(trainer.final_weights(), args.final_weights)
    if finished:
        log("training finished")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
