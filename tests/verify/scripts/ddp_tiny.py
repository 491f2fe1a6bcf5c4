"""A hand-written DDP loop on gloo (each rank its own random batches, dropout, AdamW) adopted
with ``LoopState`` over the model DDP wraps: at 3 ranks or more what ``cycle verify`` finds
IDENTICAL only with its gradient buckets settled. It writes ``final.pt`` at the end.

    cycle verify --nproc-per-node 3 tests/verify/scripts/ddp_tiny.py [--no-settle]

``--no-settle`` leaves out ``settle_ddp_buckets``: a resumed process's first step then sums its
gradients in DDP's initial bucket layout, the uninterrupted run's in the rebuilt one.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cycler import settle_ddp_buckets
from cycler.integrations.loop import LoopState


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-settle", action="store_true")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same weights and data on every rank
    data = torch.randn(512, 16)
    targets = (data @ torch.randn(16, 1)).squeeze(1)
    raw = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 64),
                        nn.GELU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(raw.parameters(), lr=3e-3)
    loop = LoopState(keep_last=-1, model=raw, optimizer=optimizer)
    model = DistributedDataParallel(raw)
    if not args.no_settle:
        settle_ddp_buckets(model)
    torch.manual_seed(1 + rank)  # each rank's own batches and dropout
    (iter_num,) = loop.resume(iter_num=0)
    while iter_num < args.iters:
        rows = torch.randint(0, len(data), (16,))
        loss = nn.functional.mse_loss(model(data[rows]).squeeze(1), targets[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        iter_num += 1
        time.sleep(args.step_seconds)
        if loop.step(iter_num=iter_num):
            break
    loop.close()
    if not loop.stopped and rank == 0:
        torch.save(raw.state_dict(), "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
