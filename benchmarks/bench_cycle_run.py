"""``cycle run``'s overhead: start-up against bare torchrun, SIGTERM until every process is gone.

Goals: time to the first line of user code <= 1.2x bare torchrun's; SIGTERM to every process of
the job gone within one step + the checkpoint's save time + 0.5 s.

    python benchmarks/bench_cycle_run.py [--repeats 5] [--size-mb 100] [--step 0.05]
    python benchmarks/bench_cycle_run.py --repeats 1 --size-mb 1        # the smoke size

Start-up: the same script (its first line writes ``time.time()`` to a file, before any import) is
launched ``--repeats`` times by ``cycle run`` and by ``python -m torch.distributed.run
--standalone`` with 1 and 2 processes, interleaved; the figures are the median and the best
time from launch to the moment every rank ran its first line (on a shared machine the best of
several runs is the steadier figure; the ratio uses it).

Stop: one worker holds a ``--size-mb`` tensor and takes ``--step``-second steps; on the control
file's ``checkpoint_and_exit`` it saves the tensor with AtomicDirectory + ``atomic_torch_save``
(timed inside the worker) and exits 0. The figure is the time from SIGTERM to the supervisor's
exit with every process of its tree gone; the overhead is that minus the save time and one step.
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
from _checks import duration, exists, exited, require

FIRST_LINE_SCRIPT = """\
import os, sys, time
stamp = repr(time.time())
open(os.path.join(sys.argv[1], "first-" + os.environ.get("RANK", "0")), "w").write(stamp)
"""

STOP_SCRIPT = """\
import os, sys, time
from pathlib import Path
import torch
from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.protocol.control import Action, ControlFileWatcher
from cycler.checkpoint.saving import atomic_torch_save

out, size_mb, step_seconds = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
weights = torch.randn(size_mb * 1024 * 1024 // 4)
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"], strategy="offline", keep_last=1)
watcher = ControlFileWatcher(os.environ["CYCLER_CONTROL_FILE"])
(out / "ready").write_text("")
while True:
    request = watcher.poll()
    if request is not None and request.action is Action.CHECKPOINT_AND_EXIT:
        started = time.time()
        path = saver.prepare_checkpoint_directory()
        atomic_torch_save({"weights": weights}, os.path.join(path, "model.pt"))
        saver.symlink_latest(path, {"step": 0})
        (out / "save").write_text(json.dumps({"seconds": time.time() - started}))
        sys.exit(0)
    time.sleep(step_seconds)
""".replace("import os, sys, time", "import json, os, sys, time")


def first_line_seconds(command: list[str], out: Path, nproc: int) -> float:
    for stale in out.glob("first-*"):
        stale.unlink()
    launched = time.time()
    process = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             check=False)
    run = f"{' '.join(command[2:4])} with {nproc} ranks"
    exited(process, run)
    stamps = [float(exists(out / f"first-{rank}", run).read_text()) for rank in range(nproc)]
    return duration(launched, max(stamps), run, "the time to the first line")


def startup(repeats: int) -> list[dict[str, object]]:
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory)
        script = out / "first.py"
        script.write_text(FIRST_LINE_SCRIPT)
        for nproc in (1, 2):
            bare = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(nproc), "--max-restarts", "0", str(script), str(out)]
            cycle = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", str(nproc),
                     "--checkpoint-dir", str(out / "ck"), str(script), str(out)]
            times: dict[str, list[float]] = {"torchrun": [], "cycle run": []}
            for _ in range(repeats):
                times["torchrun"].append(first_line_seconds(bare, out, nproc))
                times["cycle run"].append(first_line_seconds(cycle, out, nproc))
            bare_times, cycle_times = times["torchrun"], times["cycle run"]
            rows.append({"nproc": nproc,
                         "torchrun_median_s": round(statistics.median(bare_times), 3),
                         "cycle_run_median_s": round(statistics.median(cycle_times), 3),
                         "torchrun_best_s": round(min(bare_times), 3),
                         "cycle_run_best_s": round(min(cycle_times), 3),
                         "ratio_best": round(min(cycle_times) / min(bare_times), 2)})
    return rows


def stop_once(size_mb: int, step: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory)
        script = out / "stop.py"
        script.write_text(STOP_SCRIPT)
        command = [sys.executable, "-m", "cycler_cli", "run", "--checkpoint-dir",
                   str(out / "ck"), str(script), str(out), str(size_mb), str(step)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (out / "ready").exists():
            require(process.poll() is None, "stop",
                    f"cycle run exited {process.returncode} before the worker ran")
            time.sleep(0.01)
        tree = psutil.Process(process.pid).children(recursive=True)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait()
        supervisor_exit = time.monotonic() - signalled
        _, alive = psutil.wait_procs(tree, timeout=30)
        all_gone = time.monotonic() - signalled
        require(code == 75, "stop", f"exited {code}, expected 75 (stopped with a checkpoint)")
        require(not alive, "stop", f"left processes behind: {alive}")
        save = json.loads(exists(out / "save", "stop").read_text())["seconds"]
    return {"sigterm_to_all_gone_s": all_gone, "supervisor_exit_s": supervisor_exit,
            "save_s": save, "overhead_s": all_gone - save - step}


def stop(repeats: int, size_mb: int, step: float) -> dict[str, float]:
    runs = [stop_once(size_mb, step) for _ in range(repeats)]
    return {key: round(statistics.median(run[key] for run in runs), 3) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--step", type=float, default=0.05)
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    for row in startup(args.repeats):
        print("startup", json.dumps(row))
    figures = stop(args.repeats, args.size_mb, args.step)
    print("stop", json.dumps({"size_mb": args.size_mb, "step_s": args.step, **figures}))


if __name__ == "__main__":
    main()
