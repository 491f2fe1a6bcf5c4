"""A script that ends right after `StepControl.close()` ends cleanly on every rank.

Before the fix 10 of 30 two-rank runs of this script aborted rank 1 at interpreter exit
("terminate called without an active exception", exit -6): gloo's worker thread dropped the last
reference to the final exchange's work, and with it the exchange's Python tensor, while the
interpreter was finalizing. On two hosts the abort came after the job's last checkpoint and the
restart it caused could never complete. 0 of 30 after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = """
import torch.distributed as dist
from cycler import StepControl
dist.init_process_group("gloo")
control = StepControl(sync_every=1)
for step in range(20):
    control.step()
control.close()
dist.destroy_process_group()
"""


def test_twelve_runs_that_end_right_after_close_never_abort(tmp_path: Path) -> None:
    script = tmp_path / "ends_after_close.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for run in range(12):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "2", str(script)], capture_output=True,
                              text=True, timeout=120, env=env)
        output = done.stdout + done.stderr
        assert done.returncode == 0 and "terminate called" not in output, (run, output)
