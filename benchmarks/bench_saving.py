"""What atomic saving costs over ``torch.save`` + ``fsync``, the durable baseline.

Goal: at most 1.05x the baseline at 100 MB and 1 GB, for both savers.

    python benchmarks/bench_saving.py [--sizes 10MB,100MB,1GB] [--repeats 5] [--dir PATH]

Each size is a state dict of float32 tensors (64 MiB at most each). Three ways of saving it:

- ``baseline``: ``torch.save(state, path)`` then ``fsync`` of the file: what a careful user
  writes by hand, durable but not atomic.
- ``atomic_torch_save``: the same file through a unique temporary, fsync, rename, fsync of the
  directory.
- ``AtomicDirectory``: ``prepare_checkpoint_directory()``, ``torch.save`` into it (no fsync of
  its own), ``symlink_latest()``: the commit fsyncs, checksums (XXH3) and writes the manifest,
  then swaps the link. ``keep_last=-1``, so no retention runs inside the timing.

Every repetition runs the three in a rotated order (so none always goes first, with a cold
cache or after another's writeback), each into a fresh file or directory; what the previous
repetition wrote is deleted before the timing. Figures are medians. ``--profile-commit`` also
times the commit's parts alone: fsync, checksum, and both at once as ``seal`` runs them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from _checks import exists, require

from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.checkpoint.checksum import file_checksum
from cycler.checkpoint.saving import atomic_torch_save

MIB = 1 << 20
SIZES = {"10MB": 10 * MIB, "100MB": 100 * MIB, "1GB": 1024 * MIB}
CHUNK = 64 * MIB
METHODS = ("baseline", "atomic_torch_save", "AtomicDirectory")


def make_state(size: int) -> dict[str, torch.Tensor]:
    """``size`` bytes of float32 tensors, at most ``CHUNK`` bytes each."""
    state = {}
    for number, start in enumerate(range(0, size, CHUNK)):
        state[f"layer{number}.weight"] = torch.rand(min(CHUNK, size - start) // 4)
    return state


def save_baseline(state: dict[str, torch.Tensor], place: Path) -> None:
    path = place / "model.pt"
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(state: dict[str, torch.Tensor], place: Path) -> None:
    atomic_torch_save(state, place / "model.pt")


def save_directory(state: dict[str, torch.Tensor], place: Path) -> None:
    saver = AtomicDirectory(place, keep_last=-1)
    path = Path(saver.prepare_checkpoint_directory())
    torch.save(state, path / "model.pt")
    saver.symlink_latest(path, metadata={"step": 1})


SAVERS: dict[str, Callable[[dict[str, torch.Tensor], Path], None]] = {
    "baseline": save_baseline,
    "atomic_torch_save": save_atomic,
    "AtomicDirectory": save_directory,
}


def time_once(method: str, state: dict[str, torch.Tensor], work: Path) -> float:
    place = work / method
    shutil.rmtree(place, ignore_errors=True)
    place.mkdir()
    os.sync()  # the deletion's and the previous writes' writeback stay out of the timing
    started = time.perf_counter()
    SAVERS[method](state, place)
    seconds = time.perf_counter() - started
    check_saved(method, state, place)
    return seconds


def check_saved(method: str, state: dict[str, torch.Tensor], place: Path) -> None:
    """The timed save wrote the whole state (and the directory saver committed it)."""
    if method == "AtomicDirectory":
        latest = AtomicDirectory(place).latest_checkpoint()
        require(latest is not None, method, "committed no checkpoint")
        assert latest is not None
        place = Path(latest)
    size = sum(t.numel() * t.element_size() for t in state.values())
    written = exists(place / "model.pt", method).stat().st_size
    require(written >= size, method, f"wrote {written} bytes of a {size}-byte state")


def measure(size: int, repeats: int, work: Path) -> dict[str, list[float]]:
    state = make_state(size)
    times: dict[str, list[float]] = {method: [] for method in METHODS}
    for method in METHODS:  # warm-up: first-call imports and allocations
        time_once(method, make_state(MIB), work)
    for repetition in range(repeats):
        order = METHODS[repetition % 3:] + METHODS[:repetition % 3]
        for method in order:
            times[method].append(time_once(method, state, work))
    for method in METHODS:
        shutil.rmtree(work / method, ignore_errors=True)
    return times


def profile_commit(size: int, work: Path) -> dict[str, float]:
    """The commit's parts for one file of ``size`` bytes, each on freshly written data: its
    fsync alone, its checksum alone (data already on disk), ``seal`` (both at once, plus the
    manifest), and the fixed cost of prepare + commit of an empty checkpoint."""
    from cycler._fs import fsync_path
    from cycler.checkpoint.manifest import seal

    figures = {}
    for part in ("fsync", "checksum", "seal"):
        place = work / "profile"
        shutil.rmtree(place, ignore_errors=True)
        place.mkdir()
        torch.save(make_state(size), place / "model.pt")
        if part == "checksum":
            os.sync()
        started = time.perf_counter()
        if part == "fsync":
            fsync_path(place / "model.pt")
        elif part == "checksum":
            file_checksum(place / "model.pt")
        else:
            seal(place, index=0)
        figures[part] = time.perf_counter() - started
    shutil.rmtree(work / "profile")
    os.sync()
    saver = AtomicDirectory(work / "profile", keep_last=1)
    fixed = []
    for _ in range(5):
        started = time.perf_counter()
        saver.symlink_latest(saver.prepare_checkpoint_directory())
        fixed.append(time.perf_counter() - started)
    figures["empty prepare+commit"] = statistics.median(fixed)
    shutil.rmtree(work / "profile")
    return figures


def parse_sizes(text: str) -> list[str]:
    sizes = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [size for size in sizes if size not in SIZES]
    if unknown:
        raise SystemExit(f"unknown size {unknown[0]!r}; choose from {', '.join(SIZES)}")
    return sizes


def describe(work: Path) -> str:
    df = subprocess.run(["df", "-hT", str(work)], capture_output=True, text=True).stdout
    line = df.strip().splitlines()[-1].split()
    return f"{work} on {line[0]} ({line[1]}, {line[4]} free of {line[2]})"


def print_table(results: dict[str, dict[str, list[float]]]) -> None:
    """Per method: median seconds, and the median of its ratios to the baseline of the same
    repetition (paired, so that a slow minute on a shared disk cancels out), best ratio too."""
    print(f"\n{'size':>6} {'baseline':>9} | {'atomic_torch_save':^28} | {'AtomicDirectory':^28}")
    print(f"{'':>6} {'median':>9} | {'median':>9} {'ratio':>8} {'best':>9} | "
          f"{'median':>9} {'ratio':>8} {'best':>9}")
    for size, times in results.items():
        cells = [f"{size:>6} {statistics.median(times['baseline']):8.3f}s"]
        for method in METHODS[1:]:
            ratios = [t / b for t, b in zip(times[method], times["baseline"], strict=True)]
            cells.append(f"{statistics.median(times[method]):8.3f}s "
                         f"{statistics.median(ratios):7.3f}x "
                         f"{min(times[method]) / min(times['baseline']):8.3f}x")
        print(" | ".join(cells))
    print("\nratio: median of per-repetition ratios to the baseline; best: best time over the "
          "baseline's best.\nper repetition, in seconds:")
    for size, times in results.items():
        for method in METHODS:
            print(f"  {size:>6} {method:<18} " + " ".join(f"{t:.3f}" for t in times[method]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10MB,100MB,1GB", help="comma-separated subset")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--profile-commit", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench-saving-", dir=args.dir) as scratch:
        work = Path(scratch)
        print(f"writing to {describe(work)}; torch {torch.__version__}, zlib {zlib.ZLIB_VERSION}"
              f", {os.cpu_count()} CPUs, {args.repeats} repetitions")
        results = {}
        for size in parse_sizes(args.sizes):
            results[size] = measure(SIZES[size], args.repeats, work)
            print(f"  {size} done", flush=True)
            if args.profile_commit:
                parts = profile_commit(SIZES[size], work)
                print("  commit parts alone: " + ", ".join(f"{k} {v:.3f}s" for k, v in
                                                          parts.items()))
        print_table(results)


if __name__ == "__main__":
    main()
