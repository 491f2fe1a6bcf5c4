"""examples/fsdp_train.py (FSDP2 on gloo, asynchronous DCP checkpoints) under `cycle run`,
stopped by SIGTERM at random moments and resumed: final weights bit-identical to an
uninterrupted run."""

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

from cycler import EXIT_REQUEUE, EXIT_SUCCESS

pytestmark = pytest.mark.e2e  # heavy: .ci/run runs them after README's command

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdp_train.py"
ARGS = ["--epochs", "3", "--samples", "2048", "--checkpoint-every", "20", "--step-delay", "0.03"]


def start(root: Path, final: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2",
               "--checkpoint-dir", str(root), "--no-requeue", str(EXAMPLE), *ARGS,
               "--final-weights", str(final)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=root.parent)


def test_fsdp_training_stopped_three_times_ends_bit_identical(tmp_path: Path) -> None:
    reference = tmp_path / "reference.pt"
    process = start(tmp_path / "uninterrupted", reference)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == EXIT_SUCCESS, output
    rng, codes, resumed = random.Random(3), [], tmp_path / "resumed.pt"
    for _ in range(3):
        process = start(tmp_path / "stopped", resumed)
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("[fsdp] training from step"):
                break
        time.sleep(rng.uniform(0.2, 1.5))
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
        assert process.returncode in (EXIT_REQUEUE, EXIT_SUCCESS), output
        assert "Traceback" not in output, output
        codes.append(process.returncode)
        if process.returncode == EXIT_SUCCESS:
            break
    if codes[-1] != EXIT_SUCCESS:
        process = start(tmp_path / "stopped", resumed)
        output, _ = process.communicate(timeout=300)
        assert process.returncode == EXIT_SUCCESS, output
    assert codes.count(EXIT_REQUEUE) >= 2, codes
    expected = torch.load(reference, weights_only=True)
    actual = torch.load(resumed, weights_only=True)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs after {codes}"
