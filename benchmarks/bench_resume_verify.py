"""Resuming with checksum verification (the default) against an unverified resume.

Goal (issue 9): ``latest_checkpoint()`` (which now verifies the checkpoint it returns) plus
``torch.load`` within 1.3x of ``latest_checkpoint(verify=False)`` plus ``torch.load``.

    python benchmarks/bench_resume_verify.py [--size-mb 1000] [--repeats 15]

One checkpoint of one float32 tensor, committed with AtomicDirectory; the two resumes are
interleaved and both read a warm page cache (the realistic case right after a restart on the
same node is colder, which makes the extra read cost more). ``torch.load`` of 1 GB varies
0.57-0.94 s from one call to the next here, so the verification's own time is printed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from cycler import AtomicDirectory, atomic_torch_save, latest_checkpoint


def resume(root: Path, verify: bool) -> tuple[float, float]:
    """The whole resume's time, and that of ``latest_checkpoint`` alone."""
    started = time.perf_counter()
    path = latest_checkpoint(root, verify=verify)
    assert path is not None
    chosen = time.perf_counter()
    torch.load(path / "model.pt", weights_only=True)
    return time.perf_counter() - started, chosen - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as directory:
        root = Path(directory)
        saver = AtomicDirectory(root)
        path = Path(saver.prepare_checkpoint_directory())
        atomic_torch_save({"w": torch.randn(args.size_mb * 1024 * 1024 // 4)}, path / "model.pt")
        saver.symlink_latest(path)
        times: dict[bool, list[float]] = {False: [], True: []}
        checks: list[float] = []
        resume(root, False)  # warm the cache
        for repeat in range(args.repeats):
            for verify in (False, True) if repeat % 2 else (True, False):  # each first in turn
                whole, choosing = resume(root, verify)
                times[verify].append(whole)
                if verify:
                    checks.append(choosing)
        plain, verified = statistics.median(times[False]), statistics.median(times[True])
        print(json.dumps({"size_mb": args.size_mb, "unverified_s": round(plain, 3),
                          "verified_s": round(verified, 3), "ratio": round(verified / plain, 2),
                          "verification_alone_s": round(statistics.median(checks), 3)}))


if __name__ == "__main__":
    main()
