"""Hugging Face Trainer adopted with one line (CyclerCallback): a tiny GPT-2 on 2 gloo workers
under `cycle run`, in the configurations users train with, stopped by real SIGTERMs at steps no
save falls on and killed with -9 in the middle of a save, ends with weights bit-identical to the
same script's uninterrupted run without cycler."""

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
    # 2 batches a step, 10 steps an epoch, 30 in all; an evaluation and a save every 8 steps,
    # 2 kept, the best loaded at the end: the stops come mid-epoch and across an epoch's end
    config = ("--accumulate", "2", "--evaluate", "--save-steps", "8")
    plain, adopted = tmp_path / "plain", tmp_path / "adopted"
    plain_run = StackRun(plain, SCRIPT, "--out", str(plain), *config)
    assert plain_run.finish() == EXIT_SUCCESS, plain_run.output()
    codes = stop_kill_and_finish(adopted, SCRIPT, [3, 9], 8, "--out", str(adopted), "--cycler",
                                 *config, "--delay", "0.1")
    assert codes == [75, 75, 0]
    expected = torch.load(plain / "final.pt", weights_only=True)
    actual = torch.load(adopted / "final.pt", weights_only=True)
    assert_same_weights(expected, actual, f"after {codes}")
    assert_replay_verified(adopted / "ck")


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
