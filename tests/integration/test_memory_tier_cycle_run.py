"""The memory tier under real `cycle run`, real torchrun and two gloo workers (examples/train.py,
unchanged): a kill -9 of a worker restarts from a memory checkpoint newer than every durable
one and the job ends bit-identical to an uninterrupted run; a SIGTERM stop persists its
checkpoint before exit 75, and the rerun ends bit-identical too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cycle_jobs import training_workers
from gloo_ranks import free_port

from cycler import EXIT_REQUEUE, EXIT_SUCCESS, latest_checkpoint, list_checkpoints, read_manifest
from cycler.checkpoint.memory_roots import memory_base, memory_root

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
TRAIN_ARGS = ["--epochs", "2", "--samples", "2048", "--batch-size", "16", "--hidden", "64",
              "--checkpoint-every", "6", "--step-delay", "0.03", "--workers", "0"]


def start(root: Path, final: Path, *tier: str, node: tuple[str, ...] = ("--nproc-per-node", "2"),
          ) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "cycler_cli", "run", *node,
               "--checkpoint-dir", str(root), "--grace", "60", "--no-requeue", *tier,
               str(EXAMPLE), *TRAIN_ARGS, "--final-weights", str(final)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=root.parent)


def start_two_nodes(root: Path, final: Path, shm: Path, *tier: str,
                    ) -> list[subprocess.Popen[str]]:
    """Two `cycle run` nodes of one worker each on 127.0.0.1, each with its own memory dir
    (as each machine has its own /dev/shm): the same two ranks as ``start``'s."""
    port = str(free_port())
    return [start(root, final, "--memory-dir", str(shm / f"node{rank}"), *tier,
                  node=("--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
                        "--master-addr", "127.0.0.1", "--master-port", port))
            for rank in (0, 1)]


def valid(root: Path) -> list[int]:
    return [c.index for c in list_checkpoints(root) if c.valid] if root.is_dir() else []


def finish(process: subprocess.Popen[str], code: int = EXIT_SUCCESS) -> str:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == code, output
    return output


def assert_same_weights(expected_path: Path, actual_path: Path) -> None:
    expected, actual = torch.load(expected_path), torch.load(actual_path)
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("uninterrupted")
    final = base / "weights.pt"
    finish(start(base / "checkpoints", final))
    return final


def wait_for_memory_only_checkpoint(root: Path, memory: Path,
                                    process: subprocess.Popen[str]) -> tuple[int, int]:
    """Wait until memory holds a checkpoint newer than every durable one (index >= 4)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        in_memory, durable = valid(memory), valid(root)
        if in_memory and in_memory[-1] >= 4 and in_memory[-1] > max(durable, default=-1):
            return in_memory[-1], max(durable, default=-1)
        time.sleep(0.02)
    raise AssertionError("no memory-only checkpoint within 120 s")


def test_a_crash_restarts_from_memory_and_ends_bit_identical(tmp_path: Path,
                                                             reference: Path) -> None:
    root, shm, final = tmp_path / "checkpoints", tmp_path / "shm", tmp_path / "weights.pt"
    memory = memory_root(memory_base(shm), root)
    process = start(root, final, "--memory-dir", str(shm), "--persist-every", "4")
    newest_in_memory, newest_durable = wait_for_memory_only_checkpoint(root, memory, process)
    workers = training_workers(process)
    assert len(workers) == 2, workers
    workers[1].send_signal(signal.SIGKILL)
    output = finish(process)
    resumed = [int(line.rsplit("_", 1)[1].split()[0]) for line in output.splitlines()
               if "[train] resumed from AtomicDirectory_checkpoint_" in line]
    print(f"rank 1 killed with checkpoint {newest_in_memory} in memory and {newest_durable} "
          f"on disk; resumed from {resumed[0] if resumed else None}")
    assert resumed and resumed[0] >= newest_in_memory > newest_durable, output
    assert_same_weights(reference, final)
    assert not memory.exists(), "the memory tier is removed when the job ends"
    assert valid(root)[-1] >= resumed[0], "the job's end persisted the newest checkpoint"


def test_a_stop_persists_its_checkpoint_before_exit_75(tmp_path: Path, reference: Path) -> None:
    root, shm, final = tmp_path / "checkpoints", tmp_path / "shm", tmp_path / "weights.pt"
    memory = memory_root(memory_base(shm), root)
    process = start(root, final, "--memory-dir", str(shm), "--persist-every", "100")
    wait_for_memory_only_checkpoint(root, memory, process)
    process.send_signal(signal.SIGTERM)
    finish(process, EXIT_REQUEUE)
    assert valid(root)[-1] == valid(memory)[-1], "the stop's checkpoint is on disk"
    assert memory.is_dir(), "exit 75 keeps the memory tier for a rerun on this node"
    shown = json.loads(subprocess.run([sys.executable, "-m", "cycler_cli", "status", "--json",
                                       str(root)], capture_output=True, text=True,
                                      check=True).stdout)
    assert shown["memory"]["root"] == str(memory)
    assert shown["memory"]["newest"] == shown["memory"]["newest_persisted"] == valid(root)[-1]
    assert shown["memory"]["lag"] == 0
    finish(start(root, final, "--memory-dir", str(shm), "--persist-every", "100"))
    assert_same_weights(reference, final)
    assert not memory.exists()


def test_a_stop_of_two_nodes_persists_both_nodes_files_before_exit_75_and_resumes_exactly(
        tmp_path: Path, reference: Path) -> None:
    """The memory tier on two nodes: node 1's SIGTERM stops both; the stop's checkpoint, whose
    files are in two nodes' memories, is whole in the checkpoint root before exit 75."""
    root, shm, final = tmp_path / "checkpoints", tmp_path / "shm", tmp_path / "weights.pt"
    memories = [memory_root(memory_base(shm / f"node{rank}"), root) for rank in (0, 1)]
    nodes = start_two_nodes(root, final, shm, "--persist-every", "100")
    wait_for_memory_only_checkpoint(root, memories[0], nodes[0])
    nodes[1].send_signal(signal.SIGTERM)
    for node in nodes:
        finish(node, EXIT_REQUEUE)
    stop = valid(root)[-1]
    assert stop == valid(memories[0])[-1] == valid(memories[1])[-1] >= 4
    persisted = read_manifest(latest_checkpoint(root))
    assert sorted(persisted.files) == ["rank-0.pt", "rank-1.pt", "train.pt"]
    assert persisted.index == stop
    for node in start_two_nodes(root, final, shm, "--persist-every", "100"):
        finish(node)
    assert_same_weights(reference, final)
    assert not any(memory.exists() for memory in memories)


def test_kill_9_of_node_1s_worker_at_random_moments_of_the_partner_copies_ends_exactly(
        tmp_path: Path, reference: Path) -> None:
    """Two nodes, a checkpoint every 6 steps, each copied to the partner node in the background:
    node 1's worker is killed with SIGKILL 5 times at random moments (in a copy, a commit or a
    step). Every restart resumes from a checkpoint both nodes can assemble, nothing committed in
    the checkpoint root is ever invalid, and the job ends bit-identical."""
    import random

    root, shm, final = tmp_path / "checkpoints", tmp_path / "shm", tmp_path / "weights.pt"
    memories = [memory_root(memory_base(shm / f"node{rank}"), root) for rank in (0, 1)]
    nodes = start_two_nodes(root, final, shm, "--persist-every", "3")
    rng = random.Random(18)
    resumes = 0
    for kill in range(5):
        deadline = time.monotonic() + 120
        while not (valid(memories[1]) and valid(memories[1])[-1] >= 2 * (kill + 1)):
            assert nodes[0].poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        workers = training_workers(nodes[1])
        assert len(workers) == 1, workers
        workers[0].kill()
        assert all(c.valid or not c.committed for c in list_checkpoints(root)), \
            list_checkpoints(root)
        resumes += 1
        time.sleep(1.0)  # both nodes' workers restart
    outputs = [finish(node) for node in nodes]
    resumed = [line for line in outputs[0].splitlines() if "[train] resumed from" in line]
    print("\n".join(resumed))
    assert len(resumed) >= resumes, outputs[0]
    assert_same_weights(reference, final)
    assert all(c.valid or not c.committed for c in list_checkpoints(root))
    assert not any(memory.exists() for memory in memories)
