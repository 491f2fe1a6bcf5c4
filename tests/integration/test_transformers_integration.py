"""Hugging Face Trainer adopted with one line (CyclerCallback): a tiny GPT-2 on 2 or 3 gloo
workers under `cycle run`, in the configurations users train with, stopped by real SIGTERMs at
steps no save falls on and killed with -9 in the middle of a save, ends with weights
bit-identical to an uninterrupted run (at 2 ranks: the same script's run without cycler)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from stack_runs import (
    SCRIPTS,
    StackRun,
    assert_replay_verified,
    assert_same_weights,
    run_to_the_end,
    stop_kill_and_finish,
)

from cycler import EXIT_REQUEUE, EXIT_SUCCESS

transformers = pytest.importorskip("transformers",
                                   reason="the [transformers] extra is not installed")

pytestmark = pytest.mark.integrations

SCRIPT = SCRIPTS / "hf_gpt2.py"


def test_accumulation_evaluation_and_the_best_model_at_end_survive_stops_bit_identical(
        tmp_path: Path) -> None:
    # 3 ranks: their ring all-reduce sums in an order set by the gradient buckets' layout, which
    # the callback settles before the first step; without it a resumed step drifts in the last
    # bits (with ddp_find_unused_parameters=False: HF's default for a PreTrainedModel, True,
    # never rebuilds the buckets). 2 batches a step, 7 steps an epoch, 21 in all; an evaluation
    # and a save every 8 steps, 2 kept, the best loaded at the end: the stops come mid-epoch
    # and across an epoch's end. The reference is the callback's own uninterrupted run: at 3
    # ranks a run without it sums its first step in another layout (docs/saving.md, "DDP at
    # three ranks or more").
    config = ("--cycler", "--accumulate", "2", "--evaluate", "--save-steps", "8",
              "--no-unused-search")
    uninterrupted, adopted = tmp_path / "uninterrupted", tmp_path / "adopted"
    expected = run_to_the_end(uninterrupted, SCRIPT, "--out", str(uninterrupted), *config,
                              nproc=3)
    codes = stop_kill_and_finish(adopted, SCRIPT, [3, 9], 8, "--out", str(adopted), *config,
                                 "--delay", "0.1", nproc=3)
    assert codes == [75, 75, 0]
    actual = torch.load(adopted / "final.pt", weights_only=True)
    assert_same_weights(expected, actual, f"after {codes}")
    assert_replay_verified(adopted / "ck", ranks=3)


def test_hf_jit_checkpoint_gives_way_to_the_agreed_stop_when_every_process_gets_sigterm(
        tmp_path: Path) -> None:
    if "enable_jit_checkpoint" not in transformers.TrainingArguments.__dataclass_fields__:
        pytest.skip(f"transformers {transformers.__version__} has no enable_jit_checkpoint")
    # steps of 1.5 s: HF's own handler would save each rank's step 3 s after the signal, and end
    # train() as if finished, before the agreed stop two exchanges later
    plain, adopted = tmp_path / "plain", tmp_path / "adopted"
    expected = run_to_the_end(plain, SCRIPT, "--out", str(plain), "--epochs", "1")
    args = ("--out", str(adopted), "--cycler", "--jit", "--epochs", "1", "--save-steps", "100")
    stopped = StackRun(adopted, SCRIPT, *args, "--delay", "1.5")
    assert stopped.stop_every_process_after_step(4) == EXIT_REQUEUE, stopped.output()
    assert "enable_jit_checkpoint=True is replaced by cycle run's stop" in stopped.output()
    assert "training finished" not in stopped.output()
    finished = StackRun(adopted, SCRIPT, *args)
    assert finished.finish() == EXIT_SUCCESS, finished.output()
    actual = torch.load(adopted / "final.pt", weights_only=True)
    assert_same_weights(expected, actual, "after a stop with enable_jit_checkpoint")
