"""A commit's cost against the number of checkpoints kept (``keep_last=-1``).

Goal (issue 9): committing with 600 checkpoints kept costs within 1.2x of committing into an
empty root. Each commit: ``prepare_checkpoint_directory``, one 1 KB file with
``atomic_torch_save``, ``symlink_latest`` (fsyncs, manifest, link swap, retention).

    python benchmarks/bench_commit_scaling.py [--kept 600] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _checks import require

from cycler import AtomicDirectory, atomic_torch_save


def commit_times(saver: AtomicDirectory, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        directory = saver.prepare_checkpoint_directory()
        atomic_torch_save({"step": 0}, os.path.join(directory, "state.pt"))
        saver.symlink_latest(directory)
        times.append(time.perf_counter() - started)
        require(Path(saver.latest_checkpoint() or "").name == Path(directory).name,
                "commit", f"{directory} is not the latest checkpoint after its commit")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kept", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as empty, \
            tempfile.TemporaryDirectory(dir=".") as full:
        crowded = AtomicDirectory(Path(full))
        commit_times(crowded, args.kept)  # fill the root
        fresh = AtomicDirectory(Path(empty), keep_last=1)
        rounds: dict[str, list[float]] = {"empty": [], "crowded": []}
        for _ in range(3):  # interleaved, so both see the same disk
            rounds["empty"] += commit_times(fresh, args.repeats // 3)
            rounds["crowded"] += commit_times(crowded, args.repeats // 3)
        empty_s = statistics.median(rounds["empty"])
        crowded_s = statistics.median(rounds["crowded"])
        print(json.dumps({"kept": args.kept, "empty_root_commit_s": round(empty_s, 4),
                          "crowded_root_commit_s": round(crowded_s, 4),
                          "ratio": round(crowded_s / empty_s, 2)}))


if __name__ == "__main__":
    main()
