"""Accelerate adopted with AccelerateLoop: a tiny GPT-2 in the shape of HF's run_clm_no_trainer
(gradient accumulation, a schedule, a shuffled loader) on 2 or 3 gloo workers under `cycle run`,
stopped by real SIGTERMs at steps no save falls on (once mid-epoch, once at an epoch's end, so
the resume crosses the boundary) and killed with -9 in the middle of a save, ends with weights
bit-identical to an uninterrupted run's; the mistakes the loop cannot resume exactly are refused
at the first batch in one line, after two starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from stack_runs import SCRIPTS, StackRun, assert_same_weights, run_to_the_end, stop_kill_and_finish

from cycler.protocol.exit_codes import EXIT_FAILURE

pytest.importorskip("accelerate", reason="the [accelerate] extra is not installed")
pytest.importorskip("transformers", reason="the script's GPT-2 needs transformers")

pytestmark = pytest.mark.integrations

SCRIPT = SCRIPTS / "accelerate_clm.py"
EVERY_STEPS = 25  # 20 optimizer steps an epoch (160 samples, 2 a rank, 2 ranks, 2 accumulated)


@pytest.mark.timeout(1200)  # five runs of about a minute each at a load of 10
@pytest.mark.parametrize(("options", "nproc"), [([], 3), (["--mixed-precision", "bf16"], 2)],
                         ids=["fp32-3-ranks", "bf16"])
def test_an_accumulating_loop_stopped_twice_and_killed_mid_save_ends_bit_identical(
        tmp_path: Path, options: list[str], nproc: int) -> None:
    # At 3 ranks (13 steps an epoch) the ring all-reduce sums in an order set by the gradient
    # buckets' layout, which AccelerateLoop.resume settles; without it a resumed step drifts.
    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    expected = run_to_the_end(uninterrupted, SCRIPT, "--out", str(uninterrupted),
                              "--every-steps", str(EVERY_STEPS), *options, nproc=nproc)
    codes = stop_kill_and_finish(stopped, SCRIPT, [7, 18], EVERY_STEPS, "--out", str(stopped),
                                 "--every-steps", str(EVERY_STEPS), "--delay", "0.15", *options,
                                 nproc=nproc)
    assert codes == [75, 75, 0]
    actual = torch.load(stopped / "final.pt", weights_only=True)
    assert_same_weights(expected, actual, f"after {codes}")


@pytest.mark.parametrize(("hostile", "line"), [
    ("no-accumulate", "Accelerator(gradient_accumulation_steps=2) but the loop does not run its "
                      "steps in `with accelerator.accumulate(model):`"),
    ("user-skip", "already skips batches (skip_first_batches): pass the prepared "
                  "train_dataloader itself"),
    ("iterable", "the training loader reads an IterableDataset (StreamedTokens)"),
])
@pytest.mark.timeout(600)
def test_a_loop_that_cannot_resume_exactly_is_refused_in_one_line_after_two_starts(
        tmp_path: Path, hostile: str, line: str) -> None:
    run = StackRun(tmp_path, SCRIPT, "--out", str(tmp_path), "--hostile", hostile,
                   "--delay", "0")
    assert run.finish(timeout=540) == EXIT_FAILURE, run.output()
    report = "\n".join(run.lines[-40:])
    assert line in report, report
    assert "failed twice before their first step with the same error" in report, report
