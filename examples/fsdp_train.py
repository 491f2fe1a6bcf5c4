"""FSDP2 training that survives preemption: sharded, asynchronous checkpoints through cycler.

A small model sharded with ``fully_shard`` (gloo on CPU here; nccl on GPUs works the same),
saved with ``AtomicDirectory.save(..., asynchronous=True)``: torch.distributed.checkpoint writes
each rank's shards in the background while training goes on, and cycler commits them. A stop
from ``cycle run`` is decided by ``StepControl`` at one step on every rank; the stop's own save
returns only once committed. A restart loads the newest valid checkpoint in place, resharded to
the new world size if it changed.

    cycle run --nproc-per-node 2 examples/fsdp_train.py
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from cycler import (
    AtomicDirectory,
    EpochLoop,
    InterruptableDistributedSampler,
    StepControl,
    atomic_torch_save,
    default_checkpoint_root,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--final-weights", default=None)
    return parser.parse_args()


def build_model() -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights before sharding
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(args.samples, 32, generator=generator)
    dataset = TensorDataset(inputs, (inputs[:, :8] > 0).float())
    sampler = InterruptableDistributedSampler(dataset, seed=1)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    epochs = EpochLoop()
    control = StepControl(every_steps=args.checkpoint_every)
    saver = AtomicDirectory(default_checkpoint_root(), keep_last=2)

    def state() -> dict[str, object]:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        # Progress is the same on every rank: it travels in the DCP checkpoint as plain values.
        return {"model": model_state, "optimizer": optimizer_state,
                "sampler": sampler.state_dict(), "epochs": epochs.state_dict(),
                "control": control.state_dict()}

    resumed = state()
    if saver.load(resumed) is not None:
        set_state_dict(model, optimizer, model_state_dict=resumed["model"],
                       optim_state_dict=resumed["optimizer"])
        sampler.load_state_dict(resumed["sampler"])
        epochs.load_state_dict(resumed["epochs"])
        control.load_state_dict(resumed["control"])
        if rank == 0:
            print(f"[fsdp] resumed at step {control.global_step}", flush=True)
    if rank == 0:
        print(f"[fsdp] training from step {control.global_step}", flush=True)
    for epoch in epochs.remaining_epochs_until(args.epochs):
        with sampler.in_epoch(epoch):
            for batch, targets in loader:
                loss = nn.functional.binary_cross_entropy_with_logits(model(batch), targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                sampler.advance(len(batch))
                time.sleep(args.step_delay)
                decision = control.step()
                if decision.checkpoint:
                    saver.save(state(), metadata={"step": decision.step, "epoch": epoch},
                               asynchronous=True)
                if decision.stop:
                    if rank == 0:
                        print(f"[fsdp] stopping at step {decision.step}", flush=True)
                    dist.destroy_process_group()
                    return
    saver.wait()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    if rank == 0 and args.final_weights:
        atomic_torch_save(full, args.final_weights)
        print("[fsdp] training finished", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
