"""Time from process start to the first batch of examples/streaming_train.py's loader: after a
resume (StatefulDataLoader.load_state_dict of a state taken mid-epoch) against a fresh start.

Run: ``python benchmarks/bench_streaming_resume.py``

Each figure is a new Python process (imports included), one rank, ``num_workers=2``; the median
of a few repeats, taken in turn. Goal (issue 11): resume within 1.2x of the fresh start.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "streaming_train.py"
REPEATS = 5
CONSUMED = 300  # batches taken before the state is saved: far into the first epoch


def loader_and_args() -> tuple[object, object]:
    spec = importlib.util.spec_from_file_location("streaming_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    sys.argv = [str(EXAMPLE), "--shards", "64", "--sequences-per-shard", "512"]
    args = example.parse_args()
    dataset = example.TokenShards(args, 0, 1)
    loader = example.StatefulDataLoader(dataset, batch_size=args.batch_size, num_workers=2,
                                        generator=torch.Generator().manual_seed(0))
    return loader, args


def first_batch(state_path: str | None) -> None:
    """In a child: build the loader, load the state if given, print when the first batch came."""
    loader, _ = loader_and_args()
    if state_path:
        loader.load_state_dict(torch.load(state_path, weights_only=True))  # type: ignore[attr-defined]
    next(iter(loader))  # type: ignore[call-overload]
    print(time.time())


def saved_state(directory: Path) -> str:
    loader, _ = loader_and_args()
    batches = iter(loader)  # type: ignore[call-overload]
    for _ in range(CONSUMED):
        next(batches)
    path = directory / "loader.pt"
    torch.save(loader.state_dict(), path)  # type: ignore[attr-defined]
    return str(path)


def time_to_first_batch(state_path: str | None) -> float:
    began = time.time()
    command = [sys.executable, __file__, "--child", state_path or ""]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(output.splitlines()[-1]) - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", default=None)
    parser.add_argument("--smoke", action="store_true", help="one repeat: checks it runs")
    args = parser.parse_args()
    if args.child is not None:
        first_batch(args.child or None)
        return
    with tempfile.TemporaryDirectory() as directory:
        state = saved_state(Path(directory))
        fresh, resumed = [], []
        for _ in range(1 if args.smoke else REPEATS):
            fresh.append(time_to_first_batch(None))
            resumed.append(time_to_first_batch(state))
    fresh_s, resumed_s = statistics.median(fresh), statistics.median(resumed)
    print(f"fresh start to first batch:   median {fresh_s:.2f} s (runs {fresh})")
    print(f"resume to first batch:        median {resumed_s:.2f} s (runs {resumed})")
    print(f"ratio {resumed_s / fresh_s:.2f} (goal: at most 1.2)")


if __name__ == "__main__":
    main()
