"""``cycle verify``'s whole cost against the plain ``cycle run`` of the same command.

Goal (issue 27): at most 2.5x the plain run (the reference, the interrupted run and its
restarts together). Both are timed here, one after the other, on the same machine:

    python benchmarks/bench_verify.py [--epochs 4] [--samples 4096] [--step-delay 0.01]
                                      [--stops 3] [--repeats 1]
    python benchmarks/bench_verify.py --epochs 1 --samples 512 --stops 1     # the smoke size

The command is ``examples/train.py`` with a checkpoint every 16 steps. Every start of
``cycle run`` pays for its imports and process group (seconds on a loaded machine), so the
ratio falls as the plain run grows: the figure is printed with the plain run's length.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _checks import exited, ratio, require

from cycler import list_checkpoints

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.py"


def timed(command: list[str], cwd: Path) -> float:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("CYCLER_", "SLURM_"))}
    environment["TMPDIR"] = str(cwd)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout, done.stderr, sep="\n", file=sys.stderr)
    exited(done, " ".join(command[2:4]))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--step-delay", type=float, default=0.01)
    parser.add_argument("--stops", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    script = [str(EXAMPLE), "--epochs", str(args.epochs), "--samples", str(args.samples),
              "--hidden", "64", "--checkpoint-every", "16", "--step-delay", str(args.step_delay)]
    cycle = [sys.executable, "-m", "cycler_cli"]
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as directory:
            cwd = Path(directory)
            plain = timed([*cycle, "run", "--checkpoint-dir", str(cwd / "plain"), *script], cwd)
            require(list_checkpoints(cwd / "plain"), "cycle run", "committed no checkpoint")
            verify = timed([*cycle, "verify", "--stops", str(args.stops), *script], cwd)
        print(json.dumps({"steps": args.epochs * args.samples // 32, "stops": args.stops,
                          "plain_run_s": round(plain, 1), "verify_s": round(verify, 1),
                          "ratio": round(ratio(verify, plain, "cycle verify"), 2)}), flush=True)


if __name__ == "__main__":
    main()
