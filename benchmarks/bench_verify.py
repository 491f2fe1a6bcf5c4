"""``cycle verify``'s whole cost against the plain ``cycle run`` of the same command, per stack.

Goal (issues 27, 35): at most 2.5x the plain run (the reference, the interrupted run and its
restarts together). Both are timed here, one after the other, on the same machine, each
in a fresh empty working directory:

    python benchmarks/bench_verify.py [--stack train|loop|hf|lightning|accelerate] [--long]
                                      [--stops 3] [--repeats 1] [-- SCRIPT ARGS...]

``train`` is ``examples/train.py`` (64 steps, a checkpoint every 8); the others are the
adopted scripts of ``tests/verify/scripts`` (steps of 0.05 s). ``--long`` gives each step a
sleep standing for its compute, ~60 s of training in all. Besides the ratio it prints where
verify's time went (from ``cycle verify --json``): each run's seconds and, of them, its starts'
time to their first step (the stack's imports, process group, model, loading the checkpoint)
and from each stop signal to ``cycle run``'s exit. A start costs the same in a plain run and in
each of verify's 2 + stops starts, so a run that is mostly start-up costs about (2 + stops) / 1.
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

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "verify" / "scripts"
STACKS = {
    "train": [str(REPO / "examples" / "train.py"), "--epochs", "2", "--samples", "1024",
              "--batch-size", "32", "--hidden", "32", "--checkpoint-every", "8"],
    # --every: left to the automatic choice, a run of a minute or less may commit nothing (the
    # plain run must commit a checkpoint to count as a run of the stack).
    "loop": [str(SCRIPTS / "loop_tiny.py"), "--every", "8"],
    "hf": [str(SCRIPTS / "hf_tiny.py")],
    "lightning": [str(SCRIPTS / "lightning_tiny.py"), "--in-order"],
    "accelerate": [str(SCRIPTS / "accelerate_tiny.py"), "--every", "8"],
}


LONG = {
    "train": ["--step-delay", "0.95"],
    "loop": ["--step-seconds", "1.25"],
    "hf": ["--step-seconds", "1.25"],
    "lightning": ["--step-seconds", "0.95"],
    "accelerate": ["--step-seconds", "0.95"],
}
"""``--long``: a sleep per step standing for a real step's compute, ~60 s of training in each
stack's plain run (48 or 64 steps): a run whose training outweighs its start, as the runs
verify is meant for."""


def timed(command: list[str], cwd: Path, expected: tuple[int, ...]) -> tuple[float, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("CYCLER_", "SLURM_"))}
    environment["TMPDIR"] = str(cwd)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in expected:
        print(done.stdout, done.stderr, sep="\n", file=sys.stderr)
    exited(done, " ".join(command[2:4]), expected)
    return seconds, done.stdout


def load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", choices=sorted(STACKS), default="train")
    parser.add_argument("--stops", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--long", action="store_true",
                        help="~60 s of training per run (a sleep per step): training dominates")
    parser.add_argument("script", nargs="*", help="SCRIPT ARGS instead of --stack's")
    args = parser.parse_args()
    script = args.script or [*STACKS[args.stack], *(LONG[args.stack] if args.long else [])]
    cycle = [sys.executable, "-m", "cycler_cli"]
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as directory:
            cwd = Path(directory)
            (cwd / "plain").mkdir()
            before = load()
            plain, _ = timed([*cycle, "run", "--checkpoint-dir", str(cwd / "ck"), *script],
                             cwd / "plain", (0,))
            require(list_checkpoints(cwd / "ck"), "cycle run", "committed no checkpoint")
            # 0 identical, 1 different: both are verdicts, each of a whole verify.
            verify, out = timed([*cycle, "verify", "--json", "--seed", "1", "--stops",
                                 str(args.stops), *script], cwd, (0, 1))
        result = json.loads(out)
        require(len(result["runs"]) >= 2 and all(run["seconds"] > 0 for run in result["runs"]),
                "cycle verify", f"ran {len(result['runs'])} runs, expected the reference and "
                "the interrupted one")
        runs = {run["name"]: {key: run[key] for key in
                              ("seconds", "starts", "startup_seconds", "stopping_seconds")}
                for run in result["runs"]}
        print(json.dumps({"stack": args.stack, "long": args.long, "stops": args.stops,
                          "verdict": result["verdict"],
                          "plain_run_s": round(plain, 1), "verify_s": round(verify, 1),
                          "ratio": round(ratio(verify, plain, "cycle verify"), 2), "runs": runs,
                          "load": [round(before, 1), round(load(), 1)]}), flush=True)


if __name__ == "__main__":
    main()
