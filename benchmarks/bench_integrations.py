"""The integrations' cost: per-step time of the Hugging Face and Lightning scripts with the one
line of adoption against the same script without it, and what a stop costs either way.

    python benchmarks/bench_integrations.py [--repeats 2]

Both scripts are the integration tests' (tests/integration/stack_scripts): a tiny GPT-2 under a
Hugging Face Trainer, a small MLP under Lightning DDP, 2 gloo workers under ``cycle run``, the
two variants interleaved. Figures, medians of ``--repeats``:

- per-step time: from the 20th printed step (or the first seen after it) to the last, no
  saves in either variant's window but Lightning's own end-of-epoch ones, which both make;
- stop: SIGTERM to ``cycle run`` at step ``--stop-at``; the seconds until it exits, its code,
  and the steps lost: steps done minus the step of the newest checkpoint a rerun resumes from
  (the script's own ``checkpoint-N``/``.ckpt`` unadopted, cycler's commit adopted).

The hand-written-loop helper (cycler.integrations.loop.LoopState) adds one StepControl.step()
per step and nothing else: its cost is bench_control_call.py's.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _checks import duration, exited, require

from cycler import list_checkpoints

SCRIPTS = Path(__file__).resolve().parents[1] / "tests" / "integration" / "stack_scripts"
STACKS = {
    "hf": (SCRIPTS / "hf_gpt2.py", ["--samples", "1600", "--epochs", "1", "--delay", "0",
                                     "--save-steps", "25"]),
    "lightning": (SCRIPTS / "lightning_mlp.py", ["--samples", "3200"]),
}
STEP = re.compile(r"^step (\d+)$")


def run(stack: str, adopted: bool, out: Path, stop_at: int | None) -> dict[str, float]:
    script, args = STACKS[stack]
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2", "--no-requeue",
               "--checkpoint-dir", str(out / "ck"), str(script), "--out", str(out), *args]
    command += ["--cycler"] if adopted else []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=out, env={**os.environ, "OMP_NUM_THREADS": "1"})
    steps: dict[int, float] = {}
    signalled: list[float] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if (match := STEP.match(line.strip())) is not None:
                steps.setdefault(int(match.group(1)), time.monotonic())
                if stop_at is not None and int(match.group(1)) >= stop_at and not signalled:
                    signalled.append(time.monotonic())
                    process.send_signal(signal.SIGTERM)

    reader = threading.Thread(target=read)
    reader.start()
    code = process.wait(600)
    ended = time.monotonic()
    reader.join()
    name = f"{stack} {'adopted' if adopted else 'unadopted'} " + \
        ("uninterrupted" if stop_at is None else f"stopped at step {stop_at}")
    if stop_at is None:
        exited(process, name)
        # From the first step seen at or after the 20th: every HF rank prints its steps to one
        # pipe, and two ranks' lines written at once can run together ("step 20step 20"), so
        # a given step's line may be missing (step 20 was, on a fast machine).
        first = min((step for step in steps if step >= 20), default=20)
        last = max(steps, default=0)
        require(last > first, name, f"printed {last} steps, the timing starts at step {first}")
        return {"step_ms": 1000 * duration(steps[first], steps[last], name) / (last - first)}
    require(signalled, name, f"ended (exit {code}) before step {stop_at}")
    exited(process, name, expected=(0, 75))
    resumable = resumable_step(out, adopted)
    # A step whose print an exit cut short still counts as done when it was committed.
    return {"stop_s": ended - signalled[0], "code": code,
            "lost": max(max(steps), resumable) - resumable}


def resumable_step(out: Path, adopted: bool) -> int:
    if adopted:
        return max((c.manifest.step for c in list_checkpoints(out / "ck")
                    if c.valid and c.manifest and c.manifest.step is not None), default=0)
    own = [int(m.group(1)) for path in out.rglob("*")
           if (m := re.search(r"(?:checkpoint-|step=)(\d+)", path.name))]
    return max(own, default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stop-at", type=int, default=40)
    parser.add_argument("--stacks", default="hf,lightning")
    args = parser.parse_args()
    for stack in args.stacks.split(","):
        results: dict[tuple[bool, str], list[float]] = {}
        for _ in range(args.repeats):
            for adopted in (False, True):
                for stop_at in (None, args.stop_at):
                    with tempfile.TemporaryDirectory() as directory:
                        figures = run(stack, adopted, Path(directory), stop_at)
                    for key, value in figures.items():
                        results.setdefault((adopted, key), []).append(value)
        report(stack, results)


def report(stack: str, results: dict[tuple[bool, str], list[float]]) -> None:
    median = {key: statistics.median(values) for key, values in results.items()}
    ratio = median[(True, "step_ms")] / median[(False, "step_ms")]
    print(f"{stack}: per step {median[(False, 'step_ms')]:.2f} ms unadopted, "
          f"{median[(True, 'step_ms')]:.2f} ms adopted ({ratio:.3f}x)")
    for adopted in (False, True):
        name = "adopted" if adopted else "unadopted"
        print(f"{stack}: stop {name}: exit {results[(adopted, 'code')]} after "
              f"{median[(adopted, 'stop_s')]:.2f} s, {results[(adopted, 'lost')]} steps lost")


if __name__ == "__main__":
    main()
