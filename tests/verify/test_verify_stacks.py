"""``cycle verify`` on the stacks cycler integrates, adopted as documented: a bit-identical
resume is IDENTICAL (HF's log history and training arguments, Lightning's version_N folders,
times and paths are records, not state, and are listed as skipped); versions that each forget
one thing are DIFFERENT with that thing named; the end of training is compared (a scheduler
that acts after the last checkpoint); the runs never write into the caller's directory.

Marker ``verify``: tiny models, one or two stops; each test is two runs of the script plus its
restarts (the stack's own start-up, a few seconds each on an idle 2-core machine, dominates).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Two runs and their restarts of a stack whose start-up alone takes seconds (minutes on a
# loaded machine): more than the suite's 300 s default.
pytestmark = [pytest.mark.verify, pytest.mark.timeout(900)]

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def cycle_verify(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("CYCLER_", "SLURM_"))}
    environment.update(TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
    caller = tmp_path / "caller"  # the user's directory, where verify is started
    caller.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "cycler_cli", "verify", "--json", *args],
                          capture_output=True, text=True, cwd=caller, env=environment,
                          timeout=850)
    print(done.stdout[-4000:], done.stderr[-4000:])  # the report, in the log of a -rP run
    assert done.stdout.strip(), done.stderr
    return done, json.loads(done.stdout)


def cause(result: dict) -> str:
    return result["first_difference"]["cause"]["part"]


def test_an_hf_trainer_adopted_with_the_one_line_callback_is_identical_and_its_logs_skipped(
        tmp_path: Path) -> None:
    done, result = cycle_verify(tmp_path, "--stops", "2", "--seed", "1",
                                str(SCRIPTS / "hf_tiny.py"))
    assert done.returncode == 0, result
    assert result["verdict"] == "identical"
    assert any("log" in why for why in result["skipped"]), result["skipped"]
    assert result["steps_after_last_resume"] > 0  # the end of training was compared


def test_an_hf_trainer_whose_rng_is_not_restored_is_different_and_the_rng_named(
        tmp_path: Path) -> None:
    done, result = cycle_verify(tmp_path, "--stops", "1", "--seed", "1",
                                str(SCRIPTS / "hf_tiny.py"), "--forget", "rng")
    assert done.returncode == 1, result
    assert cause(result) == "the RNG streams"


def test_lightning_adopted_with_the_documented_one_line_callback_is_identical(
        tmp_path: Path) -> None:
    # 2 DDP ranks: the sampler Lightning injects is seeded. With one device and a shuffling
    # loader the integration's resume is not exact (the RandomSampler draws its order from the
    # global RNG, or restarts the loader's own generator): verify finds that, DIFFERENT.
    done, result = cycle_verify(tmp_path, "--stops", "2", "--seed", "2", "--nproc-per-node",
                                "2", str(SCRIPTS / "lightning_tiny.py"), "--devices", "2")
    assert done.returncode == 0, result
    assert result["determinism_checked_on"] >= 1
    assert any("version_N" in why or "logger" in why for why in result["skipped"])


def test_lightning_whose_loader_has_a_generator_of_its_own_is_identical(tmp_path: Path) -> None:
    # The RandomSampler drew each epoch's order from the DataLoader's own generator, which no
    # checkpoint holds, and Lightning's set_epoch never reached the rebuilt loader: a resume in
    # the second epoch drew another order, and verify said DIFFERENT, "the data order"
    # (tests/unit/test_verify_causes.py keeps that verdict's cause).
    done, result = cycle_verify(tmp_path, "--stops", "2", "--seed", "2",
                                str(SCRIPTS / "lightning_tiny.py"), "--seeded-loader",
                                "--every-steps", "8")
    assert done.returncode == 0, result


def test_a_loop_adopted_with_loop_state_is_identical_to_its_end(tmp_path: Path) -> None:
    done, result = cycle_verify(tmp_path, "--stops", "2", "--seed", "3",
                                str(SCRIPTS / "loop_tiny.py"))
    assert done.returncode == 0, result
    assert result["last_step_compared"] == 48  # the end: LoopState.close() committed it


def test_a_run_whose_steps_end_before_a_stop_can_land_is_told_so_never_identical(
        tmp_path: Path) -> None:
    # Seed 24 plans the stop at step 48, the last: it is sent when the run has ended or is
    # ending, so no resume follows, and verify must say why rather than compare nothing.
    caller = tmp_path / "caller"
    caller.mkdir()
    done = subprocess.run([sys.executable, "-m", "cycler_cli", "verify", "--stops", "1",
                           "--seed", "24", str(SCRIPTS / "loop_tiny.py")],
                          capture_output=True, text=True, cwd=caller, timeout=850,
                          env={**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "too short to interrupt" in done.stderr, done.stderr


def test_a_loop_that_leaves_its_scheduler_out_of_loop_state_is_different_and_it_is_named(
        tmp_path: Path) -> None:
    done, result = cycle_verify(tmp_path, "--stops", "1", "--seed", "3",
                                str(SCRIPTS / "loop_tiny.py"), "--forget", "scheduler")
    assert done.returncode == 1, result
    assert cause(result) == "the learning-rate scheduler"


def test_an_unsaved_scheduler_acting_after_the_last_checkpoint_is_found_at_the_end_and_the_callers_files_are_untouched(  # noqa: E501
        tmp_path: Path) -> None:
    mine = tmp_path / "caller" / "final.pt"
    mine.parent.mkdir()
    mine.write_text("MY REAL RESULT")
    done, result = cycle_verify(tmp_path, "--stops", "1", "--seed", "1", "--nproc-per-node",
                                "2", str(SCRIPTS / "unsaved_scheduler.py"))
    assert done.returncode == 1, result
    assert cause(result) == "the learning-rate scheduler"
    assert result["first_difference"]["moment"].startswith("the end of training")
    assert mine.read_text() == "MY REAL RESULT"
    assert [p.name for p in mine.parent.iterdir()] == ["final.pt"]  # nothing else written
    reference = Path(result["runs"][0]["workdir"])
    assert (reference / "final.pt").is_file()  # the run's own, where the report says


def test_an_accelerate_save_state_script_is_identical(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    done, result = cycle_verify(tmp_path, "--stops", "2", "--seed", "4",
                                str(SCRIPTS / "accelerate_tiny.py"))
    assert done.returncode == 0, result


def test_an_accelerate_script_that_loses_its_random_states_is_different_and_the_rng_named(
        tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    done, result = cycle_verify(tmp_path, "--stops", "1", "--seed", "4",
                                str(SCRIPTS / "accelerate_tiny.py"), "--forget", "rng")
    assert done.returncode == 1, result
    assert cause(result) == "the RNG streams"


def test_a_ddp_loop_at_three_ranks_differs_by_rounding_with_its_buckets_named_unless_settled(
        tmp_path: Path) -> None:
    # The resumed processes' first step sums its gradients in DDP's initial bucket layout, the
    # uninterrupted run's in the rebuilt one: at 3 ranks the weights end ~1e-8 apart, which
    # verify named "the data order" (Adam) before it knew this cause.
    script = str(SCRIPTS / "ddp_tiny.py")
    (tmp_path / "unsettled").mkdir()
    done, result = cycle_verify(tmp_path / "unsettled", "--stops", "1", "--seed", "3",
                                "--nproc-per-node", "3", script, "--no-settle")
    assert done.returncode == 1, result
    assert cause(result) == "DDP's gradient buckets, laid out differently after the resume"
    assert "settle_ddp_buckets(model)" in result["first_difference"]["cause"]["fix"]
    (tmp_path / "settled").mkdir()
    done, result = cycle_verify(tmp_path / "settled", "--stops", "1", "--seed", "3",
                                "--nproc-per-node", "3", script)
    assert done.returncode == 0, result
    assert result["last_step_compared"] == 40  # the end: LoopState.close() committed it
