"""Issue 17: a rank that hangs is found by ``cycle run`` from outside, its stacks dumped, the
workers killed and restarted from the newest checkpoint; the job ends bit-identical to one that
never hung. Slow but healthy phases (a long first step, a long save, a marked evaluation) raise
no alarm. Real ``cycle run``, torchrun and 2 gloo ranks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cycler.protocol.events import read_events

WORKER = Path(__file__).with_name("hang_worker.py")
pytestmark = pytest.mark.e2e


def cycle_run(tmp_path: Path, name: str, *worker_args: str, flags: tuple[str, ...] = ()
              ) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp_path / name
    out = tmp_path / f"{name}.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CYCLER_"))}
    env.pop("CHECKPOINT_ARTIFACT_PATH", None)
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2",
               "--checkpoint-dir", str(root), "--restart-delay", "0", *flags, str(WORKER),
               "--out", str(out), *worker_args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env,
                          cwd=tmp_path)
    return done, out


def events_of(root: Path) -> list[dict]:
    return read_events(root / ".cycler" / "events-node0.jsonl")


def test_a_rank_asleep_before_its_all_reduce_is_found_dumped_and_the_job_ends_exactly(
        tmp_path: Path) -> None:
    reference, expected = cycle_run(tmp_path, "reference")
    assert reference.returncode == 0, reference.stderr
    hung, got = cycle_run(tmp_path, "hung", "--hang-rank", "1", "--hang-step", "25",
                          flags=("--hang-timeout-min", "3"))
    assert hung.returncode == 0, hung.stderr
    hangs = [e for e in events_of(tmp_path / "hung") if e["event"] == "hang"]
    assert len(hangs) == 1, hung.stderr
    # Both ranks stopped at step 25; their stacks tell the sleeper from the one waiting for it.
    assert hangs[0]["ranks"] == [0, 1] and hangs[0]["steps"] == [25, 25]
    waiting, sleeping = hangs[0]["frames"]
    assert sleeping.startswith("hang_worker.py:") and sleeping.endswith("in <module>"), hangs[0]
    # Inside torch's all_reduce, called from the script's line.
    assert waiting.startswith("distributed_c10d.py:"), hangs[0]
    assert waiting.endswith("<- hang_worker.py:" + waiting.rsplit(":", 1)[-1]), hangs[0]
    dump = Path(hangs[0]["dump"])
    assert "time.sleep(3600)" not in (dump / "rank-1.txt").read_text()  # a stack, not source
    assert "hang_worker.py" in (dump / "rank-1.txt").read_text()
    assert "rank 1 (step 25, hang_worker.py" in hung.stderr
    final, reference_weights = torch.load(got), torch.load(expected)
    assert all(torch.equal(final[k], reference_weights[k]) for k in reference_weights)


@pytest.mark.parametrize("kind", ["deadlock", "loader"])
def test_a_deadlock_before_step_or_a_hung_dataloader_worker_is_found_and_the_job_ends_exactly(
        tmp_path: Path, kind: str) -> None:
    reference, expected = cycle_run(tmp_path, "reference", "--hang-kind", kind)
    assert reference.returncode == 0, reference.stderr
    hung, got = cycle_run(tmp_path, "hung", "--hang-rank", "1", "--hang-step", "25",
                          "--hang-kind", kind, flags=("--hang-timeout-min", "3"))
    assert hung.returncode == 0, hung.stderr
    (hang,) = [e for e in events_of(tmp_path / "hung") if e["event"] == "hang"]
    frames = dict(zip(hang["ranks"], hang["frames"], strict=True))
    dump = Path(hang["dump"])
    if kind == "deadlock":
        # Rank 0 went on to step 26's all_reduce: rank 1, behind, is the one named.
        assert hang["ranks"] == [1] and hang["steps"] == [25], hang
        assert frames[1].startswith("hang_worker.py:") and "in <module>" in frames[1], hang
        assert "rank 1 (step 25, hang_worker.py:" in hung.stderr
    else:
        # Rank 1 waits for its batch from the loader's worker, inside torch's DataLoader,
        # called from the script's line; the worker's own stack is where it sleeps.
        assert hang["ranks"] == [0, 1] and hang["steps"] == [25, 25], hang
        assert "<- hang_worker.py:" in frames[1] and "in <module>" in frames[1], hang
        assert "dataloader.py" in (dump / "rank-1.txt").read_text()
        if shutil.which("py-spy"):
            (child,) = dump.glob("rank-1.child-*.txt")
            assert "__getitem__" in child.read_text() and "hang_worker.py" in child.read_text()
        else:
            assert "not dumped (install py-spy" in (dump / "rank-1.txt").read_text()
    final, reference_weights = torch.load(got), torch.load(expected)
    assert all(torch.equal(final[k], reference_weights[k]) for k in reference_weights)


def test_a_long_first_step_a_long_save_and_a_marked_evaluation_raise_no_alarm(
        tmp_path: Path) -> None:
    # Each slow phase lasts twice the 2 s step timeout or more: without its own allowance it
    # would be a hang. (A lower floor made a busy machine's hiccup between two steps one.) The
    # first step's allowance counts from the start, imports included: 20 s was passed before
    # the first step at load 7-8 on 2 cores (CI beside three other sessions).
    done, _ = cycle_run(tmp_path, "slow", "--slow-first-step", "4", "--slow-save", "4",
                        "--eval-pause", "6",
                        flags=("--hang-timeout-min", "2", "--hang-first-step", "90",
                               "--hang-pause-timeout", "20"))
    assert done.returncode == 0, done.stderr
    assert not [e for e in events_of(tmp_path / "slow") if e["event"] == "hang"]


def test_without_hang_detection_nothing_is_watched(tmp_path: Path) -> None:
    done, _ = cycle_run(tmp_path, "off", "--steps", "20", flags=("--no-hang-detection",))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "off" / ".cycler" / "hang-node0.json").exists()
