"""A worker for the replayed-steps tests: a tiny regression trained on random batches, with a
checkpoint every 5 steps; at step 13 of the first start (``--pause-at``: a step per start)
every rank writes its pid to ``at-13-<rank>`` and waits to be killed (once). ``--mode exact`` saves
and restores the global RNG, ``--mode forget`` does not (the batches after a resume are drawn
from the seed again)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from cycler import AtomicDirectory, StepControl

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="exact")
parser.add_argument("--dir", required=True)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--pause-at", default="13",
                    help="per start, the step at which every rank writes its pid and waits")
parser.add_argument("--sleep", type=float, default=0.02, help="seconds per step after a restart")
parser.add_argument("--out", default=None, help="where rank 0 saves the final weights")
args = parser.parse_args()
rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo")
start = int(os.environ.get("CYCLER_RESTART_COUNT", "0"))
pauses = [int(step) for step in args.pause_at.split(",") if step]
pause_at = pauses[start] if start < len(pauses) else None
first_start = start == 0
torch.manual_seed(1234 + rank)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
control = StepControl(every_steps=5)
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"])
latest = saver.latest_checkpoint()
if latest is not None:
    state = torch.load(Path(latest) / f"rank-{rank}.pt", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    control.load_state_dict(state["control"])
    if args.mode != "forget":
        torch.set_rng_state(state["rng"])
while control.global_step < args.steps:
    x = torch.randn(16, 8)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(16, 1)
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    reported = {"no-loss": None, "nan": loss.detach() * float("nan")}.get(args.mode,
                                                                          loss.detach())
    decision = control.step(loss=reported)
    if decision.checkpoint:
        directory = Path(saver.prepare_checkpoint_directory())
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "control": control.state_dict(), "rng": torch.get_rng_state()},
                   directory / f"rank-{rank}.pt")
        saver.symlink_latest(directory, metadata={"step": control.global_step})
    if decision.stop:
        break
    if not first_start:
        time.sleep(args.sleep)
    marker = Path(args.dir) / f"at-{pause_at}-{rank}"
    # 13: between the checkpoints of 10 and 15; once per rank (on several nodes torchrun
    # restarts the other nodes' workers within the same start of cycle run's)
    if control.global_step == pause_at and not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(600)
control.close()
if args.out and rank == 0 and control.global_step >= args.steps:
    torch.save(model.state_dict(), args.out)
