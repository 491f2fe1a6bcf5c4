"""Training through a frozen checkpoint root (issue 36): a 2-node job's speed while its root
stalls, as a ratio against the same job's speed in windows of equal length without a stall.

Goal: >= 0.95, with no hang verdict and no node declared gone.

    python benchmarks/bench_frozen_root.py [--window 60] [--step-delay 0.05]

The root is a FUSE mount (Debian's ``bindfs``, tests/integration/frozen_mounts.py) whose daemon
is stopped with SIGSTOP for one window, as a parallel filesystem's stall stops every call on it.
Two ``cycle run`` processes (``--nnodes 2``, one gloo rank each on 127.0.0.1) run a loop of
``StepControl.step()``, a small matmul, an all-reduce and a sleep of ``--step-delay``; rank 0
writes the wall time of each step to a file outside the root. Three windows of ``--window`` s
in a row: before (no stall), frozen, after (no stall, the root thawed); the ratio is the steps
in the frozen window over the mean of the two others (so a load that drifts during the run
weighs on the baseline too). Needs root, /dev/fuse and bindfs; skipped with the reason
elsewhere (exit 5).
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

from _checks import exited, fail, ratio, require, skip

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from frozen_mounts import freezable_mount, frozen, fuse_missing  # noqa: E402
from gloo_ranks import free_port  # noqa: E402

GOAL = 0.95
JOB = """
import os, sys, time, torch, torch.distributed as dist
from cycler import StepControl
dist.init_process_group("gloo")
steps, done, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
control = StepControl(every_steps=10**9)
weights = torch.randn(128, 128)
log = open(steps, "a", buffering=1) if dist.get_rank() == 0 else None
while True:
    decision = control.step()
    weights = torch.tanh(weights @ weights / 128)
    finished = torch.tensor([1 if os.path.exists(done) else 0])
    dist.all_reduce(finished)
    time.sleep(delay)
    if log is not None:
        log.write(f"{time.time()}\\n")
    if finished.item() or decision.stop:
        break
control.close()
dist.destroy_process_group()
"""


def stamps(path: Path) -> list[float]:
    if not path.exists():
        return []
    return [float(line) for line in path.read_text().split()]


def steps_between(path: Path, start: float, end: float) -> int:
    return sum(start <= stamp < end for stamp in stamps(path))


def start_nodes(base: Path, root: Path, steps: Path, done: Path,
                delay: float) -> list[subprocess.Popen[str]]:
    script = base / "job.py"
    script.write_text(JOB)
    port = str(free_port())
    return [subprocess.Popen(
        [sys.executable, "-m", "cycler_cli", "run", "--nnodes", "2", "--node-rank", str(rank),
         "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
         "--checkpoint-dir", str(root), "--node-timeout", "30", "--no-requeue",
         str(script), str(steps), str(done), str(delay)],
        cwd=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}) for rank in (0, 1)]


def wait_for_steps(path: Path, count: int, nodes: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 300
    while len(stamps(path)) < count:
        require(all(node.poll() is None for node in nodes), "start", "a node ended early")
        require(time.monotonic() < deadline, "start", f"fewer than {count} steps in 300 s")
        time.sleep(0.2)


def windows(base: Path, window: float, delay: float) -> dict[str, object]:
    """The three windows' steps, the job's exits and output."""
    steps, done = base / "steps.txt", base / "done"
    with freezable_mount(base) as (mount, daemon):
        nodes = start_nodes(base, mount / "ck", steps, done, delay)
        try:
            wait_for_steps(steps, 20, nodes)
            time.sleep(5)  # the first step's events are written, the links are up
            before = time.time()
            time.sleep(window)
            daemon.send_signal(signal.SIGSTOP)
            frozen_at = time.time()
            require(frozen(mount / "ck"), "freeze", "the root did not freeze")
            time.sleep(max(0.0, frozen_at + window - time.time()))
            daemon.send_signal(signal.SIGCONT)
            thawed = time.time()
            require(all(node.poll() is None for node in nodes), "freeze",
                    "a node ended during the freeze")
            time.sleep(window)
            after = time.time()
            done.touch()
            outputs = [node.communicate(timeout=180)[0] for node in nodes]
        finally:
            daemon.send_signal(signal.SIGCONT)
            for node in nodes:
                if node.poll() is None:
                    node.kill()
                    node.wait()
    joined = "\n".join(outputs)
    for rank, node in enumerate(nodes):
        exited(node, f"node {rank}")
    if "is gone" in joined or "hang" in joined.lower():
        fail("freeze", f"a node was declared gone or hung:\n{joined[-2000:]}")
    return {"before": steps_between(steps, before, frozen_at),
            "frozen": steps_between(steps, frozen_at, thawed),
            "after": steps_between(steps, thawed, after)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds of each window, the freeze's too")
    parser.add_argument("--step-delay", type=float, default=0.05)
    args = parser.parse_args()
    if (reason := fuse_missing()) is not None:
        skip(reason)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        counts = windows(Path(scratch), args.window, args.step_delay)
    before, during, after = (int(counts[key]) for key in ("before", "frozen", "after"))
    require(before > 0 and after > 0, "baseline", f"no steps outside the freeze: {counts}")
    baseline = (before + after) / 2
    speed = ratio(during, baseline, "freeze") if during else 0.0
    print(json.dumps({"window_s": args.window, "steps_before": before, "steps_frozen": during,
                      "steps_after": after, "ratio": round(speed, 3), "goal": GOAL,
                      "met": speed >= GOAL, "load_start": round(load, 1),
                      "load_end": round(os.getloadavg()[0], 1)}), flush=True)


if __name__ == "__main__":
    main()
