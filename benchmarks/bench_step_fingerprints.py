"""Per-step cost of the step fingerprints (issue 35): ``StepControl.step(loss=...)`` against
``StepControl.step()`` in the same process, one rank.

Goal: under 1 % of a 10 ms step, i.e. under 100 us a step.

    python benchmarks/bench_step_fingerprints.py [--steps 20000] [--repeats 5]

Variants, interleaved, best of ``--repeats``; each times only the call, per step:

- ``step()``: no fingerprint (the baseline);
- ``step(loss=cpu tensor)``: a float32 loss tensor, read at once (``item()`` on the host);
- ``step(loss=float)``: a Python float;
- ``step(loss=cpu tensor), off``: the same outside ``cycle run`` (nothing recorded).

The records go to a private directory in ``/dev/shm`` (the tmpfs the job's runtime directory
lives on), one 32-byte ``write`` a step. A loss on a GPU is copied into a pinned ring without a
sync (see :mod:`cycler.training.fingerprints`); this CPU machine cannot time that path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cycler.training.fingerprints import FingerprintLog
from cycler.training.step_control import StepControl


def per_step(steps: int, log: FingerprintLog, loss: Any) -> float:
    """Seconds a ``control.step(loss=loss)`` takes, per step."""
    control = StepControl(control_file=None)
    control._fingerprints = log  # the variant under test, in this one process
    clock = time.perf_counter
    start = clock()
    for _ in range(steps):
        control.step(loss=loss)
    return (clock() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    loss = torch.tensor(0.6931, dtype=torch.float32)
    with tempfile.TemporaryDirectory(dir=base) as scratch:
        os.chmod(scratch, 0o700)
        variants = {
            "step()": lambda i: (FingerprintLog(Path(scratch) / f"none-{i}.fp"), None),
            "step(loss=cpu tensor)": lambda i: (FingerprintLog(Path(scratch) / f"t-{i}.fp"),
                                                loss),
            "step(loss=float)": lambda i: (FingerprintLog(Path(scratch) / f"f-{i}.fp"), 0.6931),
            "step(loss=cpu tensor), off": lambda i: (FingerprintLog(None), loss),
        }
        found: dict[str, list[float]] = {name: [] for name in variants}
        for repeat in range(args.repeats):
            for name, make in variants.items():
                found[name].append(per_step(args.steps, *make(repeat)))
    baseline = min(found["step()"])
    print(f"{args.steps} steps x {args.repeats} repeats, load {os.getloadavg()[0]:.1f}")
    print(f"{'variant':32} {'best us':>8} {'median us':>10} {'added us':>9} {'of 10 ms':>9}")
    for name, times in found.items():
        added = min(times) - baseline
        print(f"{name:32} {min(times) * 1e6:8.2f} {statistics.median(times) * 1e6:10.2f} "
              f"{added * 1e6:9.2f} {added / 0.010:9.3%}")


if __name__ == "__main__":
    main()
