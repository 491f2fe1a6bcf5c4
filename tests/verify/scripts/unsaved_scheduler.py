"""The review's script (verify-false-identical-unsaved-scheduler.sh) that never saves its LR
scheduler: a StepLR decaying at step 52, after the last checkpoint at step 50. ``cycle verify``
must compare the end of training (the ``final.pt`` it writes in its working directory) and
name the scheduler."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from cycler import (
    AtomicDirectory,
    StepControl,
    atomic_torch_save,
    capture_rng_state,
    restore_rng_state,
)

parser = argparse.ArgumentParser()
parser.add_argument("--final", default="final.pt")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=52, gamma=0.01)  # BUG: never saved
saver = AtomicDirectory(os.environ.get("CYCLER_CHECKPOINT_DIR", "ck"), keep_last=100)
control = StepControl(every_steps=10)
step = 0
latest = saver.latest_checkpoint()
if latest is not None:
    s = torch.load(os.path.join(latest, f"rank-{rank}.pt"), weights_only=True)
    model.load_state_dict(s["model"])
    opt.load_state_dict(s["optimizer"])
    control.load_state_dict(s["control"])
    restore_rng_state(s["rng"])
    step = s["step"]
g = torch.Generator()
while step < 55:
    g.manual_seed(1234 + step)
    x = torch.randn(8, 16, generator=g)
    y = x.sum(1, keepdim=True)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    step += 1
    time.sleep(0.05)
    d = control.step()
    if d.checkpoint:
        directory = saver.prepare_checkpoint_directory()
        atomic_torch_save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                           "control": control.state_dict(), "rng": capture_rng_state(),
                           "step": step}, os.path.join(directory, f"rank-{rank}.pt"))
        saver.symlink_latest(directory, metadata={"step": step})
    if d.stop:
        dist.destroy_process_group()
        raise SystemExit(0)
if rank == 0:
    torch.save(model.state_dict(), args.final)
    print(f"[sched] final weight sum {float(model.weight.sum()):.10f} "
          f"lr {opt.param_groups[0]['lr']}", flush=True)
dist.destroy_process_group()
