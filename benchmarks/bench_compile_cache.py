"""Time to the first step after a restart of ``examples/train.py --compile``: on a warm node,
on a fresh node with the compile cache carried in the checkpoint root, and on a fresh node
without it (the uncached cost).

Goal (issue 28 item 4): the fresh node with the carried cache within 1.3x of the warm node.
A "node" is a ``TMPDIR`` and a ``HOME`` of its own: a fresh one is empty (no torch cache, no
precompiled header, no cycler directory). Every restart resumes the same checkpoint from its
own copy of a prepared root; the kinds are interleaved, the medians compared. The time is from
starting ``cycle run`` to the workers' first step (the events log's ``first_step``), with the
breakdown's ``compile`` part beside it.

    python benchmarks/bench_compile_cache.py [--repeats 3] [--nproc-per-node 1]
    python benchmarks/bench_compile_cache.py --portable
    python benchmarks/bench_compile_cache.py --killed [--repeats 3]

``--portable`` measures instead why the cache directory is carried rather than torch's
portable artifacts (``torch.compiler.save_cache_artifacts``): one process each, the first
compiled training step of a small model, uncached; on the same node (cache directory and
``TMPDIR`` kept); on a fresh node after ``load_cache_artifacts`` of the first process's
artifacts; on a fresh node given a copy of the cache directory and precompiled headers.

``--killed`` measures the job that never reaches the end of ``cycle run``: a compiled run
(a step every 0.05 s, as every run here, a checkpoint every 16 steps) is kill -9'd whole (the
supervisor and every process below it, as a node failure) ``KILL_AFTER`` s after its first
checkpoint, then restarted on a fresh node: the time to its first step, whether a carried
cache was there, and the time of each 16 steps before and after the first checkpoint (the
carry during the run, if any, writes in the seconds after it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _checks import (
    duration,
    events,
    events_since,
    exists,
    exited,
    first_step_since,
    ratio,
    require,
)

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = REPOSITORY / "examples" / "train.py"
# Steps of at least 0.05 s: the supervisor reads the workers' beacons twice a second, and a
# run whose compiled steps all come between two readings records no first step of its own.
TRAIN = ("--compile", "--samples", "1024", "--checkpoint-every", "16", "--hidden", "64",
         "--step-delay", "0.05")
KINDS = ("warm", "fresh_carried", "fresh_uncached")


def cycle_run(root: Path, node: Path, nproc: int, run: str, epochs: int = 1000,
              stop_after: str = "first_step", train: tuple[str, ...] = TRAIN,
              ) -> tuple[float, float]:
    """Run the example under ``cycle run`` on ``node`` until this run's first ``stop_after``
    event (``first_step`` or ``checkpoint_committed``), then SIGTERM it (a stop: exit 75);
    seconds from the start to the workers' first step of this run, and its compile part.
    Fails (:mod:`_checks`) when the run made no step of its own or did not stop as asked."""
    env = {**os.environ, "TMPDIR": str(node / "tmp"), "HOME": str(node / "home")}
    for name in ("tmp", "home"):
        (node / name).mkdir(parents=True, exist_ok=True)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    started = time.time()
    job = subprocess.Popen([sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node",
                            str(nproc), "--checkpoint-dir", str(root), str(SCRIPT), *train,
                            "--epochs", str(epochs)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while job.poll() is None and not events_since(root, started, stop_after):
        time.sleep(0.05)
    if job.poll() is None:
        job.send_signal(signal.SIGTERM)
    exited(job, run, expected=(75,))
    first = first_step_since(root, started, run)
    return duration(started, float(first["at"]), run, "the time to the first step"), \
        float(first.get("compile", 0.0))


KILL_AFTER = 12.0
"""Seconds from the first checkpoint to the kill: the carry's 5 s settle and its write."""


def killed_then_fresh(work: Path, nproc: int) -> dict[str, object]:
    """One kill -9 of a compiled job after its first checkpoint and its restart on a fresh
    node (see the module's docstring)."""
    import psutil

    root, node = work / "root-killed", work / "node-killed"
    for path in (root, node, work / "node-fresh"):
        shutil.rmtree(path, ignore_errors=True)
    for name in ("tmp", "home"):
        (node / name).mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(node / "tmp"), "HOME": str(node / "home")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    job = subprocess.Popen([sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node",
                            str(nproc), "--checkpoint-dir", str(root), str(SCRIPT), *TRAIN,
                            "--epochs", "1000"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not events_since(root, 0.0, "checkpoint_committed"):
        require(job.poll() is None, "killed", f"ended (exit {job.returncode}) before its first "
                "checkpoint")
        time.sleep(0.05)
    time.sleep(KILL_AFTER)
    everyone = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
    for process in everyone:
        process.kill()
    job.wait()
    found = events(root)
    commits = [float(e["time"]) for e in found if e["event"] == "checkpoint_committed"]
    carries = [float(e["time"]) - commits[0] for e in found
               if e["event"] == "compile_cache_carried"]
    carried = (root / ".cycler" / "compile-cache.tar").exists()
    first_step, compile_s = cycle_run(root, work / "node-fresh", nproc, "fresh after the kill")
    return {"carried": carried, "fresh_first_step_s": round(first_step, 2),
            "fresh_compile_s": round(compile_s, 2),
            "carried_s_after_first_checkpoint": [round(t, 2) for t in carries],
            "checkpoints_s_after_first": [round(t - commits[0], 2) for t in commits]}


def restart(kind: str, prepared: Path, warm_node: Path, work: Path, nproc: int,
            ) -> tuple[float, float]:
    root = work / f"root-{kind}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(prepared, root, symlinks=True)
    if kind == "fresh_uncached":
        (root / ".cycler" / "compile-cache.tar").unlink()
    node = warm_node if kind == "warm" else work / f"node-{kind}"
    if kind != "warm":
        shutil.rmtree(node, ignore_errors=True)
    return cycle_run(root, node, nproc, kind)


PORTABLE_STEP = """
import sys, time
import torch
from torch import nn
from torch._dynamo.utils import counters
mode, artifacts = sys.argv[1], sys.argv[2]
started = time.monotonic()
if mode == "portable":
    with open(artifacts, "rb") as source:
        torch.compiler.load_cache_artifacts(source.read())
loaded = time.monotonic()
model = torch.compile(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loss = nn.functional.cross_entropy(model(torch.randn(32, 32)), torch.randint(0, 4, (32,)))
loss.backward()
optimizer.step()
print(round(loaded - started, 2), round(time.monotonic() - loaded, 2),
      dict(counters["inductor"]).get("fxgraph_cache_hit", 0))
if mode == "uncached":
    with open(artifacts, "wb") as sink:
        sink.write(torch.compiler.save_cache_artifacts()[0])
"""


def portable_comparison(work: Path) -> dict[str, object]:
    """The first compiled step per kind of start (see the module's docstring)."""
    script, artifacts = work / "step.py", work / "artifacts.bin"
    script.write_text(PORTABLE_STEP)

    def step(mode: str, node: str) -> dict[str, float]:
        env = {**os.environ, "TMPDIR": str(work / node / "tmp"),
               "TORCHINDUCTOR_CACHE_DIR": str(work / node / "cache")}
        (work / node / "tmp").mkdir(parents=True, exist_ok=True)
        out = subprocess.run([sys.executable, str(script), mode, str(artifacts)], env=env,
                             check=True, capture_output=True, text=True).stdout.split()
        return {"load_s": float(out[0]), "first_step_s": float(out[1]), "hits": int(out[2])}

    report: dict[str, object] = {"uncached": step("uncached", "a"), "warm": step("warm", "a")}
    report["fresh_portable"] = step("portable", "b")
    shutil.copytree(work / "a" / "cache", work / "c" / "cache")
    shutil.copytree(work / "a" / "tmp", work / "c" / "tmp")
    report["fresh_directory_copy"] = step("copy", "c")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--portable", action="store_true",
                        help="compare with torch's portable cache artifacts instead")
    parser.add_argument("--killed", action="store_true",
                        help="a fresh node's first step after a kill -9 of the whole job")
    args = parser.parse_args()
    if args.killed:
        with tempfile.TemporaryDirectory(prefix="bench-compile-") as scratch:
            runs = [killed_then_fresh(Path(scratch), args.nproc_per_node)
                    for _ in range(args.repeats)]
        firsts = [float(str(run["fresh_first_step_s"])) for run in runs]
        print(json.dumps({"fresh_first_step_s": statistics.median(firsts), "runs": runs},
                         indent=1))
        return
    if args.portable:
        with tempfile.TemporaryDirectory(prefix="bench-compile-") as scratch:
            print(json.dumps(portable_comparison(Path(scratch)), indent=1))
        return
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as scratch:
        work = Path(scratch)
        prepared, warm_node = work / "prepared", work / "node-warm"
        # Stopped after its first checkpoint: every restart resumes mid-training and takes
        # the first step of its own run (a finished job's restart would make none).
        first, _ = cycle_run(prepared, warm_node, args.nproc_per_node, "prepare",
                             stop_after="checkpoint_committed")
        exists(prepared / ".cycler" / "compile-cache.tar", "prepare")
        # The warm node knows the restart's graphs too (one warm-up restart).
        restart("warm", prepared, warm_node, work, args.nproc_per_node)
        times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
        for _ in range(args.repeats):
            for kind in KINDS:
                times[kind].append(restart(kind, prepared, warm_node, work, args.nproc_per_node))
        report = {"first_run_s": round(first, 2)}
        for kind in KINDS:
            report[f"{kind}_first_step_s"] = round(statistics.median(t for t, _ in times[kind]), 2)
            report[f"{kind}_compile_s"] = round(statistics.median(c for _, c in times[kind]), 2)
        warm = report["warm_first_step_s"]
        for kind in KINDS[1:]:
            report[f"{kind}_over_warm"] = round(ratio(report[f"{kind}_first_step_s"], warm, kind),
                                                2)
        report["all_s"] = {kind: [round(t, 2) for t, _ in times[kind]] for kind in KINDS}
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
