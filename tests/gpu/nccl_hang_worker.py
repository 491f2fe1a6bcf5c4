"""A small data-parallel training on the GPU for the NCCL hang test, run by ``cycle run``.

Every rank trains the same linear model on its own slice of a fixed dataset, averaging
gradients with ``all_reduce`` and reading the loss every step (the host waits for the GPU
there); every 10 steps all ranks save and commit; a restart resumes from the newest checkpoint.
At the end rank 0 writes the weights to ``--out``.

On the first start only, ``--hang-rank R --hang-step S`` makes rank R's collective of step S
never complete, by ``--hang-kind``: ``peer`` (several ranks), rank R sleeps before its
all-reduce, so the others' NCCL all-reduce waits for it forever; ``device`` (one rank is
enough), a kernel that spins for an hour is queued ahead of the all-reduce, which then never
runs. Either way the host of a stuck rank waits in ``loss.item()`` for a stream that never
drains, the way a rank stuck in an NCCL collective looks from outside.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from cycler import AtomicDirectory, StepControl

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--out", required=True)
parser.add_argument("--backend", default="nccl")
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-step", type=int, default=-1)
parser.add_argument("--hang-kind", choices=("peer", "device"), default="peer")
args = parser.parse_args()

if torch.cuda.is_available():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
else:  # a CPU rehearsal of the suite
    device = torch.device("cpu")
dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
first_start = os.environ.get("CYCLER_RESTART_COUNT", "0") == "0"
torch.manual_seed(0)
inputs, targets = torch.randn(4096, 64).to(device), torch.randn(4096, 1).to(device)
model = torch.nn.Linear(64, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"], keep_last=2)
step = 0
latest = saver.latest_checkpoint()
if latest is not None:
    state = torch.load(Path(latest) / f"rank-{rank}.pt", weights_only=True, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = int(state["step"])
control = StepControl(every_steps=10, start_step=step)
hangs_here = first_start and rank == args.hang_rank
while step < args.steps:
    start = (step * world + rank) * 32 % 4096
    loss = torch.nn.functional.mse_loss(model(inputs[start:start + 32]),
                                        targets[start:start + 32])
    optimizer.zero_grad()
    loss.backward()
    if hangs_here and step == args.hang_step:
        if args.hang_kind == "peer":
            time.sleep(3600)  # never reaches the all-reduce the other ranks wait in
        torch.cuda._sleep(2**62)  # the all-reduce below is queued behind this, for ever
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= world
    optimizer.step()
    loss.item()  # the host waits for the stream: here a stuck collective holds it
    step += 1
    time.sleep(0.02)
    decision = control.step()
    if decision.checkpoint:
        path = Path(saver.prepare_checkpoint_directory())
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step}, path / f"rank-{rank}.pt")
        saver.symlink_latest(path, metadata={"step": step})
    if decision.stop:
        break
control.close()
if rank == 0 and step >= args.steps:
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out)
dist.destroy_process_group()
