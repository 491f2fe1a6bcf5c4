"""How long a hung rank costs under ``cycle run``: detection and restart, against the step time.

    python benchmarks/bench_hang.py [--steps-seconds 0.05,0.5] [--factor 3] [--floor 1]
    python benchmarks/bench_hang.py --steps-seconds 0.05               # the smoke size

For each step interval: ``cycle run`` of ``tests/integration/hang_worker.py`` on 2 gloo ranks,
rank 1 sleeping forever before its all_reduce at step 25 of the first start. From the events
log: the silence before the verdict (the beacons' last progress to the ``hang`` event), the
allowance it was measured against (``max(floor, factor x the longest step seen)``), and the
restart (the ``hang`` event to the restarted workers' ``first_step``), and for comparison the
restart after a crash of the same rank at the same step (its exit to the ``first_step``).
Goal (issue 17): detection <= max(floor, k x longest) + 2 s; with the floor at its least
(1 s), <= 3 x the longest interval + 2 s; the restart after a hang within 1.2x the restart
after a crash.
torchrun alone waits for the process group's timeout: 30 min for gloo, 10 min for NCCL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _checks import duration, exited, require

from cycler.protocol.events import read_events

WORKER = Path(__file__).resolve().parent.parent / "tests" / "integration" / "hang_worker.py"


def one_run(step_seconds: float, factor: float, floor: float, crash: bool = False,
            ) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory) / "ck"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CYCLER_"))}
        env.pop("CHECKPOINT_ARTIFACT_PATH", None)
        steps = 40 if step_seconds < 1 else 30
        command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2",
                   "--checkpoint-dir", str(root), "--restart-delay", "0",
                   "--hang-timeout-min", str(floor), "--hang-factor", str(factor), str(WORKER),
                   "--out", str(Path(directory) / "out.pt"), "--steps", str(steps),
                   "--hang-rank", "1", "--hang-step", "25", "--step-seconds", str(step_seconds),
                   *(["--crash"] if crash else [])]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        run = f"{'crash' if crash else 'hang'} at {step_seconds} s steps"
        exited(done, run)
        events = read_events(root / ".cycler" / "events-node0.jsonl")
    cause = next((e for e in events if e["event"] == ("workers_exited" if crash else "hang")),
                 None)
    require(cause is not None, run, "recorded no " + ("crash" if crash else "hang"))
    assert cause is not None
    restarted = [e for e in events if e["event"] == "first_step" and e["at"] > cause["time"]]
    require(restarted, run, "made no step after its restart")
    restart = duration(cause["time"], restarted[0]["at"], run, "the restart")
    if crash:
        return {"step_s": step_seconds, "crash_restart_s": round(restart, 2)}
    return {"step_s": step_seconds, "allowance_s": cause["allowance"],
            "silent_for_s": cause["silent_for"],
            "over_allowance_s": round(cause["silent_for"] - cause["allowance"], 2),
            "restart_s": round(restart, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-seconds", default="0.05,0.5")
    parser.add_argument("--factor", type=float, default=3.0)
    # cycle run's least --hang-timeout-min (a floor of 0 is refused since issue 22).
    parser.add_argument("--floor", type=float, default=1.0)
    args = parser.parse_args()
    for step_seconds in (float(s) for s in args.steps_seconds.split(",")):
        print(json.dumps(one_run(step_seconds, args.factor, args.floor)), flush=True)
        print(json.dumps(one_run(step_seconds, args.factor, args.floor, crash=True)), flush=True)


if __name__ == "__main__":
    main()
