"""A rank that stops calling StepControl.step() (its data ran out first) on 2 real gloo ranks:
the other rank gets, within the exchange timeout and a few seconds, an error that names the
missing rank, the step it waited at, and where the missing rank left, instead of hanging until
the process group's timeout."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import free_port

from cycler.errors import CoordinationTimeout
from cycler.training.step_control import StepControl

TIMEOUT = 3.0
SHORT_RANK_STEPS = 5


def _rank(rank: int, port: int, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    control = StepControl(control_file=None, sync_every=1, exchange_timeout=TIMEOUT)
    if rank == 1:
        for _ in range(SHORT_RANK_STEPS):
            control.step()
        control.close()
        deadline = time.monotonic() + TIMEOUT + 20
        while not (out / "report.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # alive, but never calling step() again
        return
    started = time.monotonic()
    try:
        for _ in range(1000):
            control.step()
            time.sleep(0.01)
    except CoordinationTimeout as error:
        report = {"message": str(error), "seconds": time.monotonic() - started}
        (out / "report.json").write_text(json.dumps(report))


def test_a_rank_that_stops_calling_step_is_named_with_the_step_within_the_timeout(
        tmp_path: Path) -> None:
    mp.spawn(_rank, args=(free_port(), tmp_path), nprocs=2, join=True)
    report = json.loads((tmp_path / "report.json").read_text())
    message = report["message"]
    assert "missing: rank 1" in message, message
    assert f"rank 1 closed its StepControl at step {SHORT_RANK_STEPS}" in message, message
    assert "waited 3 s at step" in message and "call step() once per step" in message
    assert report["seconds"] < TIMEOUT + 8, report
