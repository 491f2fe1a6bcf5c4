"""What an interruption costs, and whether ``cycle status`` says so: the driven measurement.

The same job (``examples/train.py``, 2 ranks, gloo on CPU) runs three ways, one after the other:

- ``none``: uninterrupted: the stopwatch's wall, and ``W``, the training it needs (the useful
  training ``cycle status`` counts for it: its wall less its start). Each other mode is
  compared with the mean of the uninterrupted runs just before and after it (``--modes
  none,stop,none,kill,none``): on a shared machine the load, and the training's own time with
  it, drifts from one run to the next;
- ``stop``: ``cycle run`` gets SIGTERM ``--every`` s after each run's first step, checkpoints
  at a step its ranks agree on and exits 75; it is run again at once until it finishes;
- ``kill``: the whole job (``cycle``, torchrun, the workers) gets SIGKILL ``--every`` s after
  each run's first step and is run again, resuming from its last periodic checkpoint
  (``--checkpoint-every`` steps): the anchor every tool can reach without an agreed stop.
  (Figures before issue 39 counted ``--every`` from each run's start.)

For each: the stopwatch's wall (from the first ``cycle run`` to the last one's exit, the gaps
between runs included), the cost per interruption ((wall - wall of none) / interruptions;
"within noise" where the interrupted run was the faster), the
goodput at a preemption every 5 minutes (1 - cost / 300), the stopwatch's goodput
(``W`` / wall) and ``cycle status``'s goodput for the same root, and status's own figures: its
wall, its cost per interruption and the biggest parts of the breakdown.

    python benchmarks/bench_goodput.py [--epochs 12] [--every 45] [--checkpoint-every 1500]
    python benchmarks/bench_goodput.py --samples 16384 --epochs 4 --step-delay 0.04 \
        --every 25 --checkpoint-every 250      # a shorter job, steady on a loaded machine
    python benchmarks/bench_goodput.py ... --modes none,stop --fresh-too  # forked vs fresh

The machine's load (1-minute load average, cores) is printed with the figures: on a shared
machine a restart's imports and a step's time vary with the other jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from _checks import events_since, require

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = REPOSITORY / "examples" / "train.py"
EXIT_REQUEUE = 75


def command(root: Path, args: argparse.Namespace, cycle_args: str) -> list[str]:
    return [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", str(args.nproc),
            "--checkpoint-dir", str(root), *cycle_args.split(), str(SCRIPT),
            "--epochs", str(args.epochs), "--samples", str(args.samples),
            "--checkpoint-every", str(args.checkpoint_every),
            "--step-delay", str(args.step_delay)]


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to ``cycle run`` and every process under it at once: a node lost."""
    try:
        tree = [psutil.Process(process.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for member in tree:
        try:
            member.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def drive(root: Path, args: argparse.Namespace, mode: str, cycle_args: str) -> dict[str, Any]:
    """Run the job to its end, interrupting each run after ``--every`` s (mode stop, kill)."""
    interruptions, codes = 0, []
    log = open(root.parent / f"{root.name}.log", "ab")
    started = time.time()
    while True:
        begun = time.time()
        process = subprocess.Popen(command(root, args, cycle_args), stdout=log,
                                   stderr=subprocess.STDOUT, cwd=REPOSITORY)
        if mode != "none":
            wait_for_first_step(root, begun, process)
        try:
            code = process.wait(timeout=None if mode == "none" else args.every)
        except subprocess.TimeoutExpired:
            interruptions += 1
            if mode == "stop":
                process.send_signal(signal.SIGTERM)
            else:
                kill_tree(process)
            code = process.wait()
        codes.append(code)
        if code == 0:
            break
        require(not (mode == "stop" and code != EXIT_REQUEUE), mode,
                f"cycle run exited {code} after a stop, expected {EXIT_REQUEUE}; see {log.name}")
        require(len(codes) <= args.max_runs, mode, f"did not end in {args.max_runs} runs; see "
                f"{log.name}")
    wall = time.time() - started
    log.close()
    require(mode == "none" or interruptions, mode, "the job ended before its first "
            "interruption: nothing to measure (raise --epochs or lower --every)")
    shown = status(root)
    require(shown.get("useful", 0) > 0, mode, "cycle status counts no useful training")
    return {"mode": mode, "variant": cycle_args, "wall": wall, "interruptions": interruptions,
            "codes": codes, "status": shown}


def wait_for_first_step(root: Path, begun: float, process: subprocess.Popen[bytes]) -> None:
    """Until the run begun at ``begun`` made its first step (or ended): ``--every`` counts from
    there, so a run slowed by the machine's load is interrupted while it trains, never while it
    starts (a stop before any step has nothing to checkpoint: exit 1, nothing measured)."""
    while not events_since(root, begun, "first_step") and process.poll() is None:
        time.sleep(0.1)


def status(root: Path) -> dict[str, Any]:
    shown = subprocess.run([sys.executable, "-m", "cycler_cli", "status", str(root), "--json"],
                           capture_output=True, check=True, cwd=REPOSITORY)
    figures: dict[str, Any] = json.loads(shown.stdout)["goodput"]
    return figures


def summarise(result: dict[str, Any], bases: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one mode against the uninterrupted runs ``bases`` (their mean)."""
    shown, count = result["status"], result["interruptions"]
    work = sum(base["status"]["useful"] for base in bases) / len(bases)
    base_wall = sum(base["wall"] for base in bases) / len(bases)
    cost = (result["wall"] - base_wall) / count if count else None
    # An interrupted run faster than the uninterrupted ones beside it: the machine's noise is
    # larger than the interruption's cost at this size, never a negative cost.
    noise = cost is not None and cost < 0
    cost = None if noise else cost
    lost = [i["lost"] for i in shown["interruptions"]]
    parts = sorted(shown["parts"].items(), key=lambda item: -item[1])
    return {
        "mode": result["mode"], "variant": result["variant"], "wall": round(result["wall"], 1),
        "interruptions": count,
        "cost": None if cost is None else round(cost, 2), "cost_within_noise": noise,
        "at_5_min": None if cost is None else round(1 - cost / 300, 4),
        "stopwatch_goodput": round(work / result["wall"], 4),
        "status_goodput": shown["goodput"], "status_wall": shown["wall"],
        "status_cost": round(sum(lost) / len(lost), 2) if lost else None,
        "parts": {name: round(seconds / max(count, 1), 2) for name, seconds in parts[:6]},
        "redone": shown["redone"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="seconds each step sleeps: a training time the load hardly moves")
    parser.add_argument("--every", type=float, default=45.0,
                        help="seconds of each run before its interruption")
    parser.add_argument("--checkpoint-every", type=int, default=1500, help="steps")
    parser.add_argument("--modes", default="none,stop,none,kill,none")
    parser.add_argument("--cycle-args", default="",
                        help="more options for every cycle run (--no-fork-workers)")
    parser.add_argument("--fresh-too", action="store_true",
                        help="each run again at once with --no-fork-workers: forked and fresh "
                        "workers in the same run, under the same load")
    parser.add_argument("--max-runs", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the checkpoint roots and logs under this new directory")
    args = parser.parse_args()
    os.environ.pop("SLURM_JOB_ID", None)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as scratch:
        where = Path(scratch) if args.keep is None else args.keep
        where.mkdir(parents=True, exist_ok=True)
        results = []
        variants = [args.cycle_args, *([f"{args.cycle_args} --no-fork-workers".strip()]
                                       if args.fresh_too else [])]
        for number, mode in enumerate(args.modes.split(",")):
            for index, variant in enumerate(variants):
                results.append(drive(where / f"{number}-{mode}-{index}", args, mode, variant))
                print(json.dumps({k: v for k, v in results[-1].items() if k != "status"}),
                      flush=True)
    step = len(variants)
    for index, result in enumerate(results):
        # Against the uninterrupted runs (of the same variant) just before and after it: the
        # load of a shared machine drifts, and with it the time the training itself takes.
        same = results[index % step::step]
        here = index // step
        near = [r for r in same[max(here - 1, 0):here + 2] if r["mode"] == "none"]
        near = near or [r for r in same if r["mode"] == "none"]
        rows.append(summarise(result, near))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{args.nproc} ranks, {args.epochs} epochs of {args.samples} samples, "
          f"{args.step_delay:g} s sleep a step, interrupted every {args.every:g} s, "
          f"checkpoints every {args.checkpoint_every} steps; cycle run {args.cycle_args}")
    print("| cycle args | interruption | wall | n | cost each | goodput at 1/5 min | stopwatch "
          "goodput | status goodput | status wall | status cost each | biggest parts (s each) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in row["parts"].items())
        print(f"| {row['variant'] or '-'} | {row['mode']} | {row['wall']:.1f} s | "
              f"{row['interruptions']} | "
              f"{'within noise' if row['cost_within_noise'] else _s(row['cost'])} | "
              f"{_pct(row['at_5_min'])} | {_pct(row['stopwatch_goodput'])}"
              f" | {_pct(row['status_goodput'])} | {row['status_wall']:.1f} s | "
              f"{_s(row['status_cost'])} | {parts or '-'} |")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


if __name__ == "__main__":
    main()
