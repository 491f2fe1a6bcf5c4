"""A small data-parallel training for the hang tests, run by ``cycle run`` on 2 gloo ranks.

Every rank trains the same linear model on its own slice of a fixed dataset, averaging
gradients with ``all_reduce``; every 10 steps all ranks save (each its ``rank-R.pt``) and commit;
a stop or a restart resumes from the newest checkpoint. At the end rank 0 writes the weights.

Faults, for the first start only (``CYCLER_RESTART_COUNT=0``): ``--hang-rank R --hang-step S``
makes rank R hang at step S, the others then wait for it in their next collective. How, by
``--hang-kind``: ``sleep`` forever before its all_reduce; ``deadlock``: take a lock it already
holds, after its optimizer step and before ``StepControl.step()``; ``loader``: the batches come
through a DataLoader with one worker process, and rank R's worker sleeps forever on step S's.
Slow but healthy phases: ``--slow-first-step``, ``--slow-save`` and ``--eval-pause`` seconds.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from cycler import AtomicDirectory, StepControl

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--out", required=True)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-step", type=int, default=-1)
parser.add_argument("--slow-first-step", type=float, default=0.0)
parser.add_argument("--slow-save", type=float, default=0.0)
parser.add_argument("--eval-pause", type=float, default=0.0)
parser.add_argument("--step-seconds", type=float, default=0.02)
parser.add_argument("--hang-kind", choices=("sleep", "deadlock", "loader"), default="sleep")
parser.add_argument("--crash", action="store_true", help="exit 1 instead of hanging")
parser.add_argument("--crash-at-exit-rank", type=int, default=-1,
                    help="this rank exits 3 right after its training loop ended")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# Restarts by cycle run (one node) or by torchrun's agent (several nodes) are not first starts.
first_start = (os.environ.get("CYCLER_RESTART_COUNT", "0") == "0"
               and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0")
torch.manual_seed(0)
inputs, targets = torch.randn(4096, 16), torch.randn(4096, 1)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"], keep_last=2)
step = 0
latest = saver.latest_checkpoint()
if latest is not None:
    state = torch.load(Path(latest) / f"rank-{rank}.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = int(state["step"])
control = StepControl(every_steps=10, start_step=step)
if first_start and args.slow_first_step:
    time.sleep(args.slow_first_step)
hangs_here = first_start and rank == args.hang_rank


class Batches(torch.utils.data.Dataset):
    """Step s's batch of this rank, the same with or without a loader."""

    def __len__(self) -> int:
        return args.steps

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if hangs_here and args.hang_kind == "loader" and index == args.hang_step:
            time.sleep(3600)  # the DataLoader worker process hangs on this batch
        start = (index * world + rank) * 32 % 4096
        return inputs[start:start + 32], targets[start:start + 32]


if args.hang_kind == "loader":
    sampler = range(step, args.steps)
    batches = iter(torch.utils.data.DataLoader(Batches(), batch_size=None, sampler=sampler,
                                               num_workers=1))
else:
    batches = (Batches()[index] for index in range(step, args.steps))
lock = threading.Lock()
while step < args.steps:
    features, labels = next(batches)
    loss = torch.nn.functional.mse_loss(model(features), labels)
    optimizer.zero_grad()
    loss.backward()
    if hangs_here and step == args.hang_step and args.hang_kind == "sleep":
        if args.crash:
            os._exit(1)  # a crash, for comparison
        time.sleep(3600)  # hung: never reaches the collective the others wait in
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= world
    optimizer.step()
    if hangs_here and step == args.hang_step and args.hang_kind == "deadlock":
        with lock:
            lock.acquire()  # already held by this thread: a deadlock before step()
    step += 1
    time.sleep(args.step_seconds)
    decision = control.step()
    if first_start and args.eval_pause and step == 15:
        with control.paused("eval"):
            time.sleep(args.eval_pause)
    if decision.checkpoint:
        path = Path(saver.prepare_checkpoint_directory())
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step}, path / f"rank-{rank}.pt")
        if first_start and args.slow_save and step == 30:
            time.sleep(args.slow_save)
        saver.symlink_latest(path, metadata={"step": step})
    if decision.stop:
        break
control.close()
if rank == args.crash_at_exit_rank:
    os._exit(3)  # a crash after the last collective: the others finish the training
if rank == 0 and step >= args.steps:
    torch.save(model.state_dict(), args.out)
dist.destroy_process_group()
