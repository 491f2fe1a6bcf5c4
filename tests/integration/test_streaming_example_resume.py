"""The streaming example (IterableDataset shards through StatefulDataLoader with 2 workers) under
`cycle run --nproc-per-node 2`, stopped by SIGTERM 3 times at random: each rank trains on the
same batches, in the same order, as an uninterrupted run, and the final weights are identical.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_train_example_resume import committed_steps

from cycler import EXIT_REQUEUE, EXIT_SUCCESS

pytestmark = pytest.mark.e2e  # heavy: .ci/run runs them after README's command

pytest.importorskip("torchdata.stateful_dataloader")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "streaming_train.py"
NPROC = 2
TRAIN_ARGS = ["--epochs", "2", "--shards", "8", "--sequences-per-shard", "32",
              "--batch-size", "8", "--hidden", "32", "--vocab", "128", "--workers", "2",
              "--checkpoint-every", "8", "--step-delay", "0.04"]


def start(run: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", str(NPROC),
               "--checkpoint-dir", str(run / "ck"), "--grace", "60", "--no-requeue",
               str(EXAMPLE), *TRAIN_ARGS, "--batch-log", str(run / "batches"),
               "--final-weights", str(run / "weights.pt")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=run.parent)


def finish(process: subprocess.Popen[str]) -> None:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == EXIT_SUCCESS, output


def stop_at_random(run: Path, rng: random.Random) -> int:
    """One start, SIGTERMed a random moment after training began; its exit code."""
    process = start(run)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("[train] training from step"):
            break
    time.sleep(rng.uniform(0.1, 0.8))
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode in (EXIT_REQUEUE, EXIT_SUCCESS), output
    return process.returncode


def trained_batches(log: Path) -> list[str]:
    """The batches the run's weights went through: each start replays from the step it resumed
    at, so what a stopped run logged after its last committed checkpoint is dropped there."""
    batches: list[tuple[int, str]] = []
    for line in log.read_text().splitlines():
        step, _, ids = line.partition(" ")
        if step == "start":
            batches = [(done, seen) for done, seen in batches if done <= int(ids)]
        else:
            batches.append((int(step), ids))
    return [ids for _, ids in batches]


def test_stopped_and_resumed_streaming_training_sees_the_same_batches(tmp_path: Path) -> None:
    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    uninterrupted.mkdir()
    stopped.mkdir()
    # The reference runs alongside the stopped runs: the machine's cores are shared either way.
    reference = start(uninterrupted)
    rng = random.Random(11)
    codes: list[int] = []
    while len(codes) < 3 and EXIT_SUCCESS not in codes:
        codes.append(stop_at_random(stopped, rng))
    if EXIT_SUCCESS not in codes:
        finish(start(stopped))
    finish(reference)
    assert codes.count(EXIT_REQUEUE) >= 2, codes
    assert len(committed_steps(stopped / "ck")) >= 2
    for rank in range(NPROC):
        expected = trained_batches(uninterrupted / "batches" / f"rank-{rank}.log")
        assert len(expected) == 32
        assert trained_batches(stopped / "batches" / f"rank-{rank}.log") == expected
    expected_weights = torch.load(uninterrupted / "weights.pt")
    actual_weights = torch.load(stopped / "weights.pt")
    for name in expected_weights:
        assert torch.equal(expected_weights[name], actual_weights[name]), f"{name} after {codes}"
