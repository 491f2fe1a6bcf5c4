"""Lightning adopted with one line (CyclerCallback): a small MLP with dropout on 2 gloo workers
(DDP, the sampler Lightning injects) under `cycle run`, stopped by real SIGTERMs at steps no save
falls on (once mid-epoch, once just before the end of an epoch, so a resume crosses the boundary)
and killed with -9 in the middle of a save, ends with weights bit-identical to an uninterrupted
run's, and Lightning never warns that the loader is not resumable (the script makes that warning
an error)."""

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

pytest.importorskip("lightning", reason="the [lightning] extra is not installed")

pytestmark = pytest.mark.integrations

SCRIPT = SCRIPTS / "lightning_mlp.py"
EVERY_STEPS = 25  # 20 steps an epoch (320 samples, 8 a rank, 2 ranks), 60 in all


def test_lightning_stopped_twice_and_killed_mid_save_ends_bit_identical(tmp_path: Path) -> None:
    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    expected = run_to_the_end(uninterrupted, SCRIPT, "--out", str(uninterrupted), "--cycler",
                              "--every-steps", str(EVERY_STEPS))
    codes = stop_kill_and_finish(stopped, SCRIPT, [7, 18], EVERY_STEPS, "--out", str(stopped),
                                 "--cycler", "--every-steps", str(EVERY_STEPS), "--delay", "0.1")
    assert codes == [75, 75, 0]
    actual = torch.load(stopped / "final.pt", weights_only=True)
    assert_same_weights(expected, actual, f"after {codes}")
    assert_replay_verified(stopped / "ck")
