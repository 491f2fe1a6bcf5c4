"""Issue 28, item 3: `cycle --version`, `--help`, `status`, `prune` and the supervisor process of
`cycle run` never import torch (it took `cycle --version` 3.5 s). Each runs as a real process
that reports, as it exits, whether torch is in its `sys.modules`; `cycle run`'s workers are
torchrun's processes and may import what they like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cycler import AtomicDirectory

# Registered before anything is imported; runs after typer's SystemExit, like any exit.
CYCLE = ("import atexit, sys\n"
         "said = lambda: sys.stderr.write(f'torch imported: {\"torch\" in sys.modules}\\n')\n"
         "atexit.register(said)\n"
         "from cycler_cli.main import main\n"
         "main()\n")


def cycle_reports_torch(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", CYCLE, *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    said = [line for line in done.stderr.splitlines() if line.startswith("torch imported: ")]
    assert said, done.stdout + done.stderr
    return said[-1].removeprefix("torch imported: ")


@pytest.fixture
def small_root(tmp_path: Path) -> Path:
    root = tmp_path / "checkpoints"
    saver = AtomicDirectory(root, keep_last=-1)
    for step in range(3):
        directory = Path(saver.prepare_checkpoint_directory())
        (directory / "weights.bin").write_bytes(b"x" * 1000)
        saver.symlink_latest(directory, metadata={"step": step})
    return root


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("run", "--help"),
                                  ("status", "{root}"), ("status", "{root}", "--json"),
                                  ("status", "{root}", "--verify"),
                                  ("prune", "{root}", "--dry-run"),
                                  ("prune", "{root}", "--keep-last", "1")])
def test_cycle_commands_that_only_read_or_print_never_import_torch(
        small_root: Path, args: tuple[str, ...]) -> None:
    arguments = [arg.format(root=small_root) for arg in args]
    assert cycle_reports_torch(*arguments, cwd=small_root.parent) == "False"


@pytest.mark.parametrize("tier", [(), ("--memory-dir", "shm")])
def test_the_supervisor_of_cycle_run_never_imports_torch(tmp_path: Path,
                                                        tier: tuple[str, ...]) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nprint('the worker imported torch', flush=True)\n")
    assert cycle_reports_torch("run", "--checkpoint-dir", str(tmp_path / "ck"), *tier,
                               str(script), cwd=tmp_path) == "False"
    assert cycle_reports_torch("run", "--dry-run", str(script), cwd=tmp_path) == "False"


END_OF_JOB = ("import sys\n"
              "from cycler.checkpoint.layout import CheckpointLayout\n"
              "from cycler.checkpoint.job_end import finish_job\n"
              "memory, durable = CheckpointLayout(sys.argv[1]), CheckpointLayout(sys.argv[2])\n"
              "end = finish_job(memory, durable, several_nodes=True, exit_code=75)\n"
              "print(end.failure, 'torch' in sys.modules)\n")


def test_the_end_of_a_job_on_several_nodes_never_imports_torch(small_root: Path,
                                                              tmp_path: Path) -> None:
    """The supervisor's end of job with the memory tier on several nodes: this node's
    contribution of its newer memory checkpoints to the checkpoint root (it imported torch
    through the replicas module once)."""
    durable = tmp_path / "durable"
    done = subprocess.run([sys.executable, "-c", END_OF_JOB, str(small_root), str(durable)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "False"], done.stdout + done.stderr
