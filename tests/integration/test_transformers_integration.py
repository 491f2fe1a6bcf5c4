"""Hugging Face Trainer adopted with one line (CyclerCallback): a tiny GPT-2 on 2 gloo workers
under `cycle run`, stopped by real SIGTERMs at steps no save falls on (once mid-epoch, once at
the end of an epoch, so the resume crosses the boundary) and killed with -9 in the middle of a
save, ends with weights bit-identical to the same script's uninterrupted run without cycler."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from stack_runs import (
    SCRIPTS,
    assert_replay_verified,
    assert_same_weights,
    run_to_the_end,
    stop_kill_and_finish,
)

pytest.importorskip("transformers", reason="the [transformers] extra is not installed")

pytestmark = pytest.mark.integrations

SCRIPT = SCRIPTS / "hf_gpt2.py"
SAVE_STEPS = 25  # 20 steps an epoch (160 samples, 4 a rank, 2 ranks), 60 in all


def test_trainer_stopped_twice_and_killed_mid_save_ends_bit_identical(tmp_path: Path) -> None:
    plain, adopted = tmp_path / "plain", tmp_path / "adopted"
    expected = run_to_the_end(plain, SCRIPT, "--out", str(plain))
    codes = stop_kill_and_finish(adopted, SCRIPT, [7, 18], SAVE_STEPS, "--out", str(adopted),
                                 "--cycler", "--save-steps", str(SAVE_STEPS), "--delay", "0.1")
    assert codes == [75, 75, 0]
    actual = torch.load(adopted / "final.pt", weights_only=True)
    assert_same_weights(expected, actual, f"after {codes}")
    assert_replay_verified(adopted / "ck")
