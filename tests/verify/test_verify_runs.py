"""``cycle verify`` on real runs: examples/train.py verifies identical; versions of it that each
forget one thing are caught and the thing is named; a nondeterministic script is reported as
such; a script without cycler checkpoints is told what verify needs.

Marker ``verify`` (.ci/run runs them): each test starts three to five real ``cycle run``
processes, about a minute and a half each on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.verify

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train.py"
FORGETFUL = REPO / "tests" / "verify" / "scripts" / "forgetful_train.py"
# 64 steps in 2 epochs, a checkpoint every 8; the delay lets a stop land near its planned step.
SMALL = ["--epochs", "2", "--samples", "1024", "--batch-size", "32", "--hidden", "32",
         "--checkpoint-every", "8", "--step-delay", "0.02"]


def cycle_verify(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("CYCLER_", "SLURM_"))}
    environment["TMPDIR"] = str(tmp_path)  # verify's scratch: inside the test's directory
    done = subprocess.run([sys.executable, "-m", "cycler_cli", "verify", *args],
                          capture_output=True, text=True, cwd=tmp_path, env=environment,
                          timeout=900)
    print(done.stdout, done.stderr)  # verify's report, in the log of a -rP run
    return done


def test_verify_of_the_example_finds_every_resumed_checkpoint_identical(tmp_path: Path) -> None:
    done = cycle_verify(tmp_path, "--json", "--seed", "3", str(EXAMPLE), *SMALL)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "identical"
    assert result["determinism_checked_on"] >= 1
    assert sum(1 for c in result["compared"] if c["segment"] > 0) >= 2
    assert len(result["runs"][1]["interruptions"]) == 3
    assert result["scratch"] is None  # removed: nothing to look at
    assert not any(tmp_path.glob("cycler-verify-*/verify-*"))


def test_verify_survives_a_kill_9_of_a_worker_and_still_finds_the_example_identical(
        tmp_path: Path) -> None:
    done = cycle_verify(tmp_path, "--json", "--stops", "1", "--kills", "1", "--seed", "5",
                        str(EXAMPLE), *SMALL)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = [i["kind"] for i in json.loads(done.stdout)["runs"][1]["interruptions"]]
    assert sorted(kinds) == ["kill", "stop"]


@pytest.mark.parametrize(("forget", "named"), [
    ("rng", "the RNG streams"),
    ("sampler", "the data position"),
    ("optimizer", "the optimizer"),
    ("scheduler", "the learning-rate scheduler"),
    ("rank-state", "a rank's own state"),
    ("loader-seed", "an unseeded DataLoader"),
    # Each start trained from step 0 to the same end: paired by step, its later commits
    # equalled the reference's, and verify said IDENTICAL.
    ("checkpoint", "the checkpoint, never loaded"),
])
def test_verify_of_a_script_that_forgets_one_thing_exits_1_and_names_it(
        tmp_path: Path, forget: str, named: str) -> None:
    ranks = ["--nproc-per-node", "2"] if forget == "rank-state" else []
    done = cycle_verify(tmp_path, "--stops", "1", "--seed", "1", *ranks, str(FORGETFUL),
                        "--forget", forget, *SMALL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cycle verify: DIFFERENT at step" in done.stdout
    assert f"likely cause: {named}:" in done.stdout, done.stdout
    kept = done.stdout.split("runs kept in ")[1].split(" (")[0].strip()
    assert (Path(kept) / "interrupted" / "cycle-run.log").exists()
    assert Path(kept).stat().st_mode & 0o077 == 0


def test_verify_of_a_nondeterministic_script_says_so_and_blames_no_resume(tmp_path: Path) -> None:
    done = cycle_verify(tmp_path, "--stops", "1", "--seed", "1", str(FORGETFUL),
                        "--forget", "determinism", *SMALL)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "NOT DETERMINISTIC" in done.stdout and "no resume is to blame" in done.stdout
    assert "likely cause: unseeded randomness" in done.stdout
    interrupted = [line for line in done.stdout.splitlines() if "interrupted" in line]
    assert " 1 " in interrupted[0]  # one start: stopped as soon as the first segment differed


def test_verify_of_a_script_without_cycler_checkpoints_says_what_it_needs_in_one_line(
        tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("print('training without checkpoints')\n")
    done = cycle_verify(tmp_path, str(script))
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "committed 0 cycler checkpoints" in line and "AtomicDirectory" in line


def test_verify_refuses_a_checkpoint_dir_of_its_own_before_starting_anything(
        tmp_path: Path) -> None:
    done = cycle_verify(tmp_path, "--checkpoint-dir", str(tmp_path / "mine"), str(EXAMPLE))
    assert done.returncode == 2
    assert "leave out --checkpoint-dir" in done.stderr
    assert not (tmp_path / "mine").exists() and not any(tmp_path.glob("cycler-verify-*"))


def test_verify_refuses_a_checkpoint_dir_in_a_config_file_before_starting_anything(
        tmp_path: Path) -> None:
    """Both runs would have shared the user's checkpoint root, the config file's value winning
    over the one verify gives each run."""
    config = tmp_path / "run.yaml"
    config.write_text(f"checkpoint_dir: {tmp_path / 'mine'}\n")
    done = cycle_verify(tmp_path, "--config", str(config), str(EXAMPLE))
    assert done.returncode == 2
    assert "leave out --checkpoint-dir (checkpoint_dir in" in done.stderr
    assert not (tmp_path / "mine").exists() and not any(tmp_path.glob("cycler-verify-*"))


def test_a_wall_clock_time_under_a_name_like_t_is_a_record_and_an_exact_resume_identical(
        tmp_path: Path) -> None:
    done = cycle_verify(tmp_path, "--json", "--stops", "1", "--seed", "1", str(FORGETFUL),
                        "--stamp", "t", *SMALL)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "identical"
    assert any("train.pt: t" in places for places in result["skipped"].values()), result


def test_a_step_counter_named_t_that_a_resume_loses_is_different_and_the_optimizer_named(
        tmp_path: Path) -> None:
    done = cycle_verify(tmp_path, "--stops", "1", "--seed", "1", str(FORGETFUL),
                        "--forget", "optimizer-t", "--stamp", "time", *SMALL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "optimizer.t" in done.stdout and "likely cause: the optimizer:" in done.stdout
