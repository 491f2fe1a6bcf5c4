"""A nanoGPT-style loop (random batches drawn from the global RNG, dropout, AdamW and a
cosine schedule stepped by hand) adopted with ``LoopState``: what ``cycle verify`` must find
IDENTICAL. It writes ``final.pt`` in its working directory at the end.

    cycle verify tests/verify/scripts/loop_tiny.py [--forget scheduler] [--iters N]

``--forget scheduler`` leaves the scheduler out of ``LoopState`` (so it restarts at 0 after a
resume). ``--step-seconds`` (0.05) stands for a real step's compute: without it the 48 steps
take ~50 ms, and a stop sent at step 37 could land after the last step.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from cycler.integrations.loop import LoopState


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forget", choices=["scheduler"], default=None)
    parser.add_argument("--iters", type=int, default=48)
    parser.add_argument("--every", type=int, default=None)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = torch.randn(512, 8)
    targets = (data @ torch.randn(8, 1)).squeeze(1)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.iters)
    objects = {"model": model, "optimizer": optimizer}
    if args.forget != "scheduler":
        objects["scheduler"] = scheduler
    loop = LoopState(every_steps=args.every, keep_last=-1, **objects)
    (iter_num,) = loop.resume(iter_num=0)
    while iter_num < args.iters:
        rows = torch.randint(0, len(data), (16,))
        loss = nn.functional.mse_loss(model(data[rows]).squeeze(1), targets[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        iter_num += 1
        time.sleep(args.step_seconds)
        if loop.step(iter_num=iter_num):
            break
    loop.close()
    if not loop.stopped:
        torch.save(model.state_dict(), "final.pt")


if __name__ == "__main__":
    main()
