"""Two `cycle run` supervisors as two nodes of one job (on 127.0.0.1, one worker each), sharing a
checkpoint root as nodes share a filesystem. Only node 1's supervisor gets SIGTERM, as when one
node of a job is preempted or hears the notice first: both nodes stop at the same agreed step,
both exit 75, and the job resumed to the end matches an uninterrupted one bit for bit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from gloo_ranks import free_port

from cycler import EXIT_REQUEUE, EXIT_SUCCESS, latest_checkpoint, read_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
TRAIN_ARGS = ["--epochs", "3", "--samples", "2048", "--hidden", "32", "--checkpoint-every", "0",
              "--step-delay", "0.02"]


def start_nodes(root: Path, final: Path) -> list[subprocess.Popen[str]]:
    port = str(free_port())
    nodes = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "cycler_cli", "run", "--nnodes", "2", "--node-rank",
                   str(rank), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                   "--master-port", port, "--checkpoint-dir", str(root), "--grace", "60",
                   "--no-requeue", str(EXAMPLE), *TRAIN_ARGS, "--final-weights", str(final)]
        nodes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}))
    return nodes


def finish(nodes: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    outputs = [node.communicate(timeout=180)[0] for node in nodes]
    return [(node.returncode, output) for node, output in zip(nodes, outputs, strict=True)]


def test_a_stop_heard_by_one_node_stops_both_at_one_step_and_resumes_exactly(
        tmp_path: Path) -> None:
    reference = tmp_path / "reference.pt"
    assert [code for code, _ in finish(start_nodes(tmp_path / "uninterrupted", reference))] == [
        EXIT_SUCCESS, EXIT_SUCCESS]

    root, resumed = tmp_path / "stopped", tmp_path / "resumed.pt"
    nodes = start_nodes(root, resumed)
    assert nodes[0].stdout is not None
    for line in nodes[0].stdout:  # node 0's rank 0 prints the training lines
        if line.startswith("[train] training from step"):
            break
    time.sleep(1.0)
    nodes[1].send_signal(signal.SIGTERM)
    results = finish(nodes)
    assert [code for code, _ in results] == [EXIT_REQUEUE, EXIT_REQUEUE], results
    assert "another node asked for this stop" in results[0][1]
    checkpoint = latest_checkpoint(root)
    assert checkpoint is not None and read_manifest(checkpoint).world_size == 2

    assert [code for code, _ in finish(start_nodes(root, resumed))] == [EXIT_SUCCESS] * 2
    expected, actual = torch.load(reference), torch.load(resumed)
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
