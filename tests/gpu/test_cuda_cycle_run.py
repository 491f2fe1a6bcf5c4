"""examples/train.py on the GPU under real ``cycle run``: stopped by real SIGTERMs at random
moments and resumed, its final weights bit-identical to an uninterrupted run's; and
``--nproc-per-node gpu`` starting one worker per GPU.

Bit-identical on CUDA needs deterministic kernels: the example, given ``--device cuda``, sets
``torch.use_deterministic_algorithms(True)`` and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``. Backends:
NCCL with one rank per GPU (a group of one on one GPU: DDP and the metrics still go through
NCCL), the mixed ``cpu:gloo,cuda:nccl`` group, and, with one GPU, 2 gloo ranks sharing it (NCCL
refuses two ranks on one device), so that StepControl's agreement runs too.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cuda_ranks import nccl_world
from test_train_example_resume import run_to_the_end, run_with_random_stops

from cycler import EXIT_REQUEUE, EXIT_SUCCESS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", "gloo"])
def test_the_example_stopped_by_sigterms_resumes_bit_identical_on_the_gpu(
        accelerator, tmp_path: Path, backend: str, figures: dict[str, object]) -> None:
    if backend != "gloo":
        accelerator.need_real_cuda(backend)
    elif nccl_world() >= 2:
        pytest.skip("several GPUs: the multi-rank runs are NCCL's")
    nproc = 2 if backend == "gloo" else nccl_world()
    extra = ("--device", accelerator.device, "--backend", backend)
    reference, resumed = tmp_path / "reference.pt", tmp_path / "resumed.pt"
    run_to_the_end(tmp_path / "uninterrupted", nproc, reference, 0, extra)
    codes = run_with_random_stops(tmp_path / "stopped", nproc, resumed, 0, stops=2,
                                  rng=random.Random(nproc), extra=extra)
    figures.update(backend=backend, ranks=nproc, exit_codes=codes)
    assert codes.count(EXIT_REQUEUE) >= 1 and codes[-1] == EXIT_SUCCESS, codes
    expected = torch.load(reference, map_location="cpu")
    actual = torch.load(resumed, map_location="cpu")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs after {codes}"


WORKER = """
import json, os, sys, torch
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
record = {"rank": rank, "world": int(os.environ["WORLD_SIZE"]),
          "device": torch.cuda.current_device()}
open(os.path.join(sys.argv[1], f"worker-{rank}.json"), "w").write(json.dumps(record))
"""


def test_nproc_per_node_gpu_starts_one_worker_per_gpu(accelerator, tmp_path: Path) -> None:
    accelerator.need_real_cuda("--nproc-per-node gpu")
    script = tmp_path / "which_gpu.py"
    script.write_text(WORKER)
    done = subprocess.run([sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "gpu",
                           "--checkpoint-dir", str(tmp_path / "ck"), str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == EXIT_SUCCESS, done.stderr[-3000:]
    records = sorted((json.loads(path.read_text()) for path in tmp_path.glob("worker-*.json")),
                     key=lambda record: record["rank"])
    count = torch.cuda.device_count()
    assert [r["device"] for r in records] == list(range(count)), records
    assert all(r["world"] == count for r in records), records
