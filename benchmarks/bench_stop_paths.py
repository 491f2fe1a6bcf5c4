"""Stop latency for the three kinds of script, under ``cycle run`` and under plain torchrun.

Goals: a StepControl script is gone within one step + its save + 0.5 s; a script that only
commits through AtomicDirectory within 1 s of its first commit after the request; a script that
knows nothing of cycler within 0.2 s of torchrun's own stop of the same script.

    python benchmarks/bench_stop_paths.py [--repeats 5] [--size-mb 50] [--step 0.05]
    python benchmarks/bench_stop_paths.py --repeats 1 --size-mb 1      # the smoke size

Every script runs with 2 workers and holds a ``--size-mb`` tensor per rank:

- ``step_control``: gloo, ``StepControl`` every ``--step`` s; on its decision each rank saves
  its tensor through AtomicDirectory and exits 0.
- ``saver_only``: gloo, commits its tensors through AtomicDirectory every ``--commit-every``
  s; reads no control file, installs no handler.
- ``plain``: no process group and no cycler; its SIGTERM handler saves the tensor with
  ``torch.save`` and exits 0.

The figure is the time from SIGTERM (to ``cycle run``, or to torchrun) until every process of the
job is gone, median of ``--repeats`` runs, the two launchers interleaved. Under plain torchrun the
first two scripts die on the signal (torchrun forwards it and neither has a handler): that is
the baseline a user has today, without a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _checks import require

from cycler import list_checkpoints

COMMON = """\
import json, os, signal, sys, time
from pathlib import Path
import torch
out, size_mb, step = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rank = int(os.environ["RANK"])
weights = torch.randn(size_mb * 1024 * 1024 // 4)
def record(name, value):
    (out / f"{name}-{rank}").write_text(json.dumps(value))
"""

SCRIPTS = {
    "step_control": COMMON + """\
import torch.distributed as dist
from cycler import AtomicDirectory, StepControl, atomic_torch_save
dist.init_process_group("gloo")
saver = AtomicDirectory(os.environ.get("CYCLER_CHECKPOINT_DIR", str(out / "ck")), keep_last=1)
control = StepControl()
record("ready", 0)
while True:
    time.sleep(step)
    decision = control.step()
    if decision.checkpoint:
        started = time.time()
        path = saver.prepare_checkpoint_directory()
        atomic_torch_save({"weights": weights}, os.path.join(path, f"rank-{rank}.pt"))
        saver.symlink_latest(path, {"step": decision.step})
        record("save", time.time() - started)
    if decision.stop:
        sys.exit(0)
""",
    "saver_only": COMMON + """\
import torch.distributed as dist
from cycler import AtomicDirectory, atomic_torch_save
dist.init_process_group("gloo")
saver = AtomicDirectory(os.environ.get("CYCLER_CHECKPOINT_DIR", str(out / "ck")), keep_last=1)
record("ready", 0)
while True:
    time.sleep(float(sys.argv[4]))
    path = saver.prepare_checkpoint_directory()
    atomic_torch_save({"weights": weights}, os.path.join(path, f"rank-{rank}.pt"))
    saver.symlink_latest(path, {"step": 0})
    with (out / f"commits-{rank}").open("a") as commits:
        commits.write(f"{time.time()!r}\\n")
""",
    "plain": COMMON + """\
def save_and_exit(number, frame):
    started = time.time()
    torch.save({"weights": weights}, out / f"mine-{rank}.pt")
    record("save", time.time() - started)
    sys.exit(0)
signal.signal(signal.SIGTERM, save_and_exit)
record("ready", 0)
while True:
    time.sleep(step)
""",
}


def launcher(kind: str, out: Path, script: Path, arguments: list[str]) -> list[str]:
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", "--monitor-interval", "0.02", str(script), *arguments]
    return [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2", "--no-requeue",
            "--checkpoint-dir", str(out / "ck"), str(script), *arguments]


def stop_once(script_name: str, kind: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory)
        script = out / f"{script_name}.py"
        script.write_text(SCRIPTS[script_name])
        arguments = [str(out), str(args.size_mb), str(args.step), str(args.commit_every)]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("CYCLER_")}
        run = f"{kind} {script_name}"
        process = subprocess.Popen(launcher(kind, out, script, arguments), env=environment,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not all((out / f"ready-{rank}").exists() for rank in (0, 1)):
            require(process.poll() is None, run, f"exited {process.returncode} early")
            time.sleep(0.01)
        time.sleep(args.commit_every * 1.5)  # the saver-only script has committed by now
        tree = psutil.Process(process.pid).children(recursive=True)
        sent = time.time()
        process.send_signal(signal.SIGTERM)
        code = process.wait()
        _, alive = psutil.wait_procs(tree, timeout=30)
        gone = time.time() - sent
        require(not alive, run, f"left processes behind: {alive}")
        figures = {"all_gone_s": gone, "exit_code": code}
        saves = [json.loads(p.read_text()) for p in out.glob("save-*")]
        if saves:
            figures["save_s"] = max(saves)
        # keep_last=1: the one checkpoint left is the newest; its manifest says when it was made.
        later = [c.manifest.created_at - sent for c in list_checkpoints(out / "ck")
                 if c.manifest is not None and c.manifest.created_at > sent]
        if later:
            figures["next_commit_s"] = min(later)
        check_claims(run, kind, script_name, figures)
        return figures


def check_claims(run: str, kind: str, script_name: str, figures: dict[str, float]) -> None:
    """The figures ``judge`` reads exist: the stop of each script under ``cycle run`` (and the
    plain script's own handler under both) saved what it claims to have saved."""
    if kind == "cycle run":
        require(figures["exit_code"] in (0, 75), run, f"exited {figures['exit_code']:g}, "
                "expected 75 or 0 (a stop)")
    claim = {"step_control": "save_s", "saver_only": "next_commit_s", "plain": "save_s"}
    if kind == "cycle run" or script_name == "plain":
        require(claim[script_name] in figures, run,
                f"made no {claim[script_name].removesuffix('_s').replace('_', ' ')} after the "
                "SIGTERM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--step", type=float, default=0.05)
    parser.add_argument("--commit-every", type=float, default=1.0)
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    for name in SCRIPTS:
        runs: dict[str, list[dict[str, float]]] = {"cycle run": [], "torchrun": []}
        for _ in range(args.repeats):
            for kind in runs:
                runs[kind].append(stop_once(name, kind, args))
        row: dict[str, object] = {"script": name}
        for kind, results in runs.items():
            for key in results[0]:
                values = [result[key] for result in results if key in result]
                if key == "exit_code":
                    row[f"{kind} exit codes"] = sorted(set(values))
                elif values:
                    row[f"{kind} {key}"] = round(statistics.median(values), 3)
        row.update(judge(name, row, args.step))
        print(json.dumps(row))


def judge(name: str, row: dict[str, object], step: float) -> dict[str, object]:
    """The figure each goal is about, from the medians."""
    gone = float(row["cycle run all_gone_s"])  # type: ignore[arg-type]
    if name == "step_control":
        return {"overhead_s (gone - save - step; goal <= 0.5)":
                round(gone - float(row["cycle run save_s"]) - step, 3)}  # type: ignore[arg-type]
    if name == "saver_only":
        return {"after_commit_s (gone - next commit; goal <= 1.0)":
                round(gone - float(row["cycle run next_commit_s"]), 3)}  # type: ignore[arg-type]
    return {"vs_torchrun_s (goal <= 0.2)":
            round(gone - float(row["torchrun all_gone_s"]), 3)}  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
