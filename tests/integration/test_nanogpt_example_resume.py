"""examples/nanogpt_style.py, a nanoGPT-style loop adopted with LoopState, on 3 gloo workers
under `cycle run`: stopped by real SIGTERMs at steps no save falls on and killed with -9 in the
middle of a save, it ends with weights bit-identical to an uninterrupted run's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from stack_runs import assert_same_weights, run_to_the_end, stop_kill_and_finish

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nanogpt_style.py"
EVAL_INTERVAL = 25


def test_nanogpt_style_loop_stopped_twice_and_killed_mid_save_ends_bit_identical(
        tmp_path: Path) -> None:
    plain, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    # 3 ranks: their ring all-reduce sums in an order set by the gradient buckets' layout,
    # which the example settles (settle_ddp_buckets); without it a resumed step drifts
    expected = run_to_the_end(plain, EXAMPLE, "--out-dir", str(plain), nproc=3)
    codes = stop_kill_and_finish(stopped, EXAMPLE, [7, 33], EVAL_INTERVAL, "--out-dir",
                                 str(stopped), "--eval-interval", str(EVAL_INTERVAL),
                                 "--delay", "0.1", nproc=3)
    assert codes == [75, 75, 0]
    actual = torch.load(stopped / "final.pt", weights_only=True)
    assert_same_weights(expected, actual, f"after {codes}")
