"""Lightning adopted with one line (CyclerCallback): a small MLP with dropout on 2 or 3 gloo workers
(DDP) under `cycle run`, in the configurations users train with, stopped by real SIGTERMs at
steps no save falls on and killed with -9 in the middle of a save, ends with weights
bit-identical to an uninterrupted run's, and Lightning never warns that the loader is not
resumable (the script makes that warning an error); a loader that cannot resume is refused
before the first step, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from stack_runs import (
    SCRIPTS,
    StackRun,
    assert_replay_verified,
    assert_same_weights,
    committed_steps,
    run_to_the_end,
    stop_kill_and_finish,
)

from cycler import EXIT_FAILURE, EXIT_SUCCESS, ConfigError

pytest.importorskip("lightning", reason="the [lightning] extra is not installed")

pytestmark = pytest.mark.integrations

SCRIPT = SCRIPTS / "lightning_mlp.py"
# 20 batches an epoch (320 samples, 8 a rank, 2 ranks), 3 epochs


def interrupted_runs_end_like_an_uninterrupted_one(tmp_path: Path, stop_steps: list[int],
                                                   every_steps: int, *config: str,
                                                   kill: bool = True, nproc: int = 2) -> Path:
    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    args = ("--cycler", "--every-steps", str(every_steps), *config)
    expected = run_to_the_end(uninterrupted, SCRIPT, "--out", str(uninterrupted), *args,
                              nproc=nproc)
    codes = stop_kill_and_finish(stopped, SCRIPT, stop_steps, every_steps, "--out", str(stopped),
                                 *args, "--delay", "0.1", kill=kill, nproc=nproc)
    assert codes == [75] * len(stop_steps) + [0]
    actual = torch.load(stopped / "final.pt", weights_only=True)
    assert_same_weights(expected, actual, f"after {codes} ({' '.join(config)})")
    if kill:  # a stop replays nothing: its restart resumes where it stopped
        assert_replay_verified(stopped / "ck", ranks=nproc)
    return stopped


def test_accumulated_clipped_steps_stop_only_between_optimizer_steps_and_end_bit_identical(
        tmp_path: Path) -> None:
    # 3 batches a step (7 steps an epoch): a SIGTERM lands in the middle of an accumulation 2
    # times in 3; the first stop mid-epoch, the second near an epoch's end (a resume crosses it)
    config = ("--accumulate", "3", "--clip", "0.5")
    out = interrupted_runs_end_like_an_uninterrupted_one(tmp_path, [2, 5], 10, *config)
    ran_again = StackRun(out, SCRIPT, "--out", str(out), "--cycler", *config)
    assert ran_again.finish() == EXIT_SUCCESS, ran_again.output()
    assert ran_again.steps_seen() == -1, "a finished fit was trained again:\n" + \
        ran_again.output()


def test_manual_optimization_of_two_optimizers_stops_between_their_steps_bit_identical(
        tmp_path: Path) -> None:
    # 3 ranks (14 batches a rank an epoch): their ring all-reduce sums in an order set by the
    # gradient buckets' layout, which the callback settles before the first forward; without it
    # the resumed step drifts in the last bits. global_step counts both optimizers' steps: 2
    # every second batch, 14 an epoch
    interrupted_runs_end_like_an_uninterrupted_one(tmp_path, [9], 100, "--manual", kill=False,
                                                   nproc=3)


def test_iterable_datasets_with_a_state_resume_bit_identical_with_and_without_torchdata(
        tmp_path: Path) -> None:
    interrupted_runs_end_like_an_uninterrupted_one(tmp_path / "stream", [9], 25,
                                                   "--data", "stream")
    interrupted_runs_end_like_an_uninterrupted_one(tmp_path / "torchdata", [9], 25,
                                                   "--data", "torchdata", kill=False)


def test_an_iterable_dataset_without_a_state_is_refused_before_the_first_step_in_one_line(
        tmp_path: Path) -> None:
    run = StackRun(tmp_path, SCRIPT, "--out", str(tmp_path), "--cycler", "--data", "plain-stream")
    assert run.finish() == EXIT_FAILURE, run.output()
    assert run.steps_seen() == -1 and not committed_steps(tmp_path / "ck"), run.output()
    said = [line for line in run.lines if "an IterableDataset without a position" in line]
    assert said and "give Stream state_dict()/load_state_dict() methods, or load it with " \
                    "torchdata's StatefulDataLoader" in said[-1], run.output()


@pytest.mark.parametrize("keep_last", [0, -2])
def test_a_keep_last_that_would_keep_nothing_is_refused_when_the_callback_is_built(
        keep_last: int) -> None:
    """In one process: it had been taken and refused only inside ``trainer.fit()``."""
    from cycler.integrations.lightning import CyclerCallback

    with pytest.raises(ConfigError, match=f"^keep_last={keep_last} would keep no checkpoint"):
        CyclerCallback(keep_last=keep_last)
    assert CyclerCallback(keep_last=1).keep_last == 1
