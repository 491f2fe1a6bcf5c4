"""A small model with dropout trained through Hugging Face Accelerate, its state saved with
``accelerator.save_state()`` into each committed cycler checkpoint (model.safetensors,
optimizer.bin, scheduler.bin, random_states_N.pkl, the sampler's state) and restored with
``load_state()`` plus ``skip_first_batches``: what ``cycle verify`` must find IDENTICAL.

    cycle verify tests/verify/scripts/accelerate_tiny.py [--forget rng|scheduler] [--every N]
                                                         [--step-seconds S]

``--forget rng`` deletes the random_states files before loading; ``--forget scheduler`` leaves
the scheduler out of the saved state (it is not registered with ``prepare``).
``--step-seconds`` (0.05) stands for a real step's compute, a sleep after each step: without
it a step takes milliseconds, and on a fast machine a stop could land after the last one.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cycler import AtomicDirectory, StepControl, default_checkpoint_root


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forget", choices=["rng", "scheduler"], default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every", type=int, default=None)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    # A seedable sampler: its order is a function of the seed and the epoch (set_epoch).
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_seedable_sampler=True))
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 8, generator=generator)
    data = TensorDataset(inputs, (inputs @ torch.randn(8, 4, generator=generator)).argmax(1))
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.8)
    loader = DataLoader(data, batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    if args.forget == "scheduler":
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    else:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader,
                                                                  scheduler)
    saver = AtomicDirectory(default_checkpoint_root(), keep_last=-1)
    control = StepControl(every_steps=args.every)
    start = 0
    latest = saver.latest_checkpoint()
    if latest is not None:
        if args.forget == "rng":
            for states in Path(latest).glob("random_states_*.pkl"):
                os.rename(states, states.with_suffix(".gone"))
        accelerator.load_state(latest)
        start = int((Path(latest) / "step.txt").read_text())
        control.load_state_dict({"version": 1, "global_step": start})
    per_epoch = len(loader)
    step = start
    for epoch in range(start // per_epoch, args.epochs):
        loader.set_epoch(epoch)
        batches = loader if epoch > start // per_epoch else \
            accelerator.skip_first_batches(loader, start % per_epoch)
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            time.sleep(args.step_seconds)
            step += 1
            decision = control.step()
            if decision.checkpoint:
                directory = saver.prepare_checkpoint_directory()
                accelerator.save_state(directory)
                if accelerator.is_main_process:
                    (Path(directory) / "step.txt").write_text(str(step))
                saver.symlink_latest(directory, metadata={"step": step, "epoch": epoch})
            if decision.stop:
                return
    control.close()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), "final.pt")


if __name__ == "__main__":
    main()
