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
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = REPOSITORY / "examples" / "train.py"
TRAIN = ["--compile", "--samples", "1024", "--checkpoint-every", "16", "--hidden", "64"]
KINDS = ("warm", "fresh_carried", "fresh_uncached")


def cycle_run(root: Path, node: Path, epochs: int, nproc: int) -> tuple[float, float]:
    """Run the example for ``epochs`` under ``cycle run`` on ``node``; seconds from the start
    to the first step of the workers."""
    env = {**os.environ, "TMPDIR": str(node / "tmp"), "HOME": str(node / "home")}
    for name in ("tmp", "home"):
        (node / name).mkdir(parents=True, exist_ok=True)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    started = time.time()
    subprocess.run([sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", str(nproc),
                    "--checkpoint-dir", str(root), str(SCRIPT), *TRAIN, "--epochs", str(epochs)],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = [e for e in events(root) if e["event"] == "first_step"][-1]
    return float(first["at"]) - started, float(first.get("compile", 0.0))


def events(root: Path) -> list[dict[str, object]]:
    lines = (root / ".cycler" / "events-node0.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


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
    return cycle_run(root, node, epochs=2, nproc=nproc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as scratch:
        work = Path(scratch)
        prepared, warm_node = work / "prepared", work / "node-warm"
        first, _ = cycle_run(prepared, warm_node, epochs=1, nproc=args.nproc_per_node)
        if not (prepared / ".cycler" / "compile-cache.tar").exists():
            sys.exit("the first run carried no compile cache")
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
        report["fresh_carried_over_warm"] = round(report["fresh_carried_first_step_s"] / warm, 2)
        report["fresh_uncached_over_warm"] = round(report["fresh_uncached_first_step_s"] / warm, 2)
        report["all_s"] = {kind: [round(t, 2) for t, _ in times[kind]] for kind in KINDS}
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
