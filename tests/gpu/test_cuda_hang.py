"""A rank stuck in an NCCL collective is found by ``cycle run`` from outside, its stack dumped
(faulthandler, while its host thread waits in C for the stream), the workers killed and
restarted from the newest checkpoint; the job ends bit-identical to one that never hung.

With several GPUs one NCCL rank per GPU, and rank 1 never reaches the all-reduce the others wait
in. With one GPU NCCL allows one rank only: its all-reduce is queued behind a kernel that never
ends, so the collective never completes (the stuck stream is the same from outside; the peer
that never came is not). The verdict time (silence before the hang was declared) and the
restart time (the hang's verdict to the first step of the restarted workers) are the figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cuda_ranks import nccl_world

from cycler import EXIT_SUCCESS
from cycler.protocol.events import read_events

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).with_name("nccl_hang_worker.py")


def cycle_run(tmp_path: Path, name: str, nproc: int, *worker_args: str
              ) -> tuple[subprocess.CompletedProcess[str], Path]:
    root, out = tmp_path / name, tmp_path / f"{name}.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CYCLER_"))}
    env.pop("CHECKPOINT_ARTIFACT_PATH", None)
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", str(nproc),
               "--checkpoint-dir", str(root), "--restart-delay", "0", "--hang-timeout-min", "3",
               str(WORKER), "--out", str(out), *worker_args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env,
                          cwd=tmp_path)
    return done, out


def test_a_rank_stuck_in_an_nccl_collective_is_found_dumped_and_restarted_exactly(
        accelerator, tmp_path: Path, figures: dict[str, object]) -> None:
    if accelerator.real:
        nproc, backend = nccl_world(), "nccl"
        kind = "peer" if nproc >= 2 else "device"
    else:  # a CPU rehearsal: 2 gloo ranks, one asleep
        nproc, backend, kind = 2, "gloo", "peer"
    hang_rank = nproc - 1
    reference, expected = cycle_run(tmp_path, "reference", nproc, "--backend", backend)
    assert reference.returncode == EXIT_SUCCESS, reference.stderr[-3000:]
    hung, got = cycle_run(tmp_path, "hung", nproc, "--backend", backend, "--hang-kind", kind,
                          "--hang-rank", str(hang_rank), "--hang-step", "25")
    assert hung.returncode == EXIT_SUCCESS, hung.stderr[-3000:]
    events = read_events(tmp_path / "hung" / ".cycler" / "events-node0.jsonl")
    (hang,) = [e for e in events if e["event"] == "hang"]
    restarted = [e for e in events if e["event"] == "first_step" and e["time"] > hang["time"]]
    figures.update(ranks=nproc, backend=backend, hang_kind=kind,
                   hang_verdict_s=hang["silent_for"], hang_allowance_s=hang["allowance"],
                   restart_s=round(restarted[0]["at"] - hang["time"], 2) if restarted else None)
    assert hang_rank in hang["ranks"], hang
    frames = dict(zip(hang["ranks"], hang["frames"], strict=True))
    # The stuck rank's main thread is in the script, waiting for its stream (or asleep).
    assert frames[hang_rank].startswith("nccl_hang_worker.py:"), hang
    dump = Path(hang["dump"]) / f"rank-{hang_rank}.txt"
    assert "nccl_hang_worker.py" in dump.read_text()
    assert restarted, "no first step after the restart"
    final = torch.load(got, weights_only=True)
    for name, tensor in torch.load(expected, weights_only=True).items():
        assert torch.equal(final[name], tensor), f"{name} differs from the run that never hung"
