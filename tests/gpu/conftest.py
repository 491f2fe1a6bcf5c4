"""The GPU suite's shared setup: one skip reason without CUDA, the accelerator the tests run on,
and the figures they leave for ``scripts/gpu-check``.

Nothing here or in a test module touches CUDA at import: collection must work on any machine.
``CYCLER_GPU_REHEARSAL=1`` runs the suite's harness on CPU (gloo, ``cpu`` tensors) so that its
helpers, workers and figures are checked where no GPU is; a test that needs CUDA itself (a
side stream, per-device generators, NCCL, ``--nproc-per-node gpu``) still skips then.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# The real-process helpers of the CPU suite (cycle_jobs, gloo_ranks) are reused, not copied.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

NO_CUDA = "no CUDA device here (torch.cuda.is_available() is False): run bash scripts/gpu-check " \
          "on a machine with a GPU"
REHEARSAL = os.environ.get("CYCLER_GPU_REHEARSAL") == "1"
FIGURES = "CYCLER_GPU_FIGURES"
"""The directory the tests write their figures into (``scripts/gpu-check`` sets it)."""
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REHEARSAL or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)


@dataclass(frozen=True)
class Accelerator:
    """Where a test runs: ``device`` for its tensors, ``backend`` for a one-rank group on it,
    ``gpus`` the devices this process sees (0 in a CPU rehearsal)."""

    device: str
    backend: str
    gpus: int

    @property
    def real(self) -> bool:
        return self.gpus > 0

    def need_real_cuda(self, what: str) -> None:
        """Skip in a CPU rehearsal: ``what`` exists only with CUDA."""
        if not self.real:
            pytest.skip(f"CPU rehearsal: {what} needs CUDA")


@pytest.fixture
def accelerator() -> Accelerator:
    if torch.cuda.is_available():
        return Accelerator("cuda", "nccl", torch.cuda.device_count())
    return Accelerator("cpu", "gloo", 0)


@pytest.fixture
def figures(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, object]]:
    """A dict the test fills with its measured figures, written as JSON once it ends (passed or
    not) to ``$CYCLER_GPU_FIGURES/<test name>.json``, else beside the test's files."""
    found: dict[str, object] = {}
    yield found
    directory = Path(os.environ.get(FIGURES) or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    name = request.node.name.replace("/", "_").replace("[", "-").replace("]", "")
    found = {"test": request.node.nodeid, "device": device_name(), **found}
    (directory / f"{name}.json").write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


def device_name() -> str:
    if not torch.cuda.is_available():
        return "cpu (rehearsal)"
    nccl = torch.cuda.nccl.version()  # a tuple; an int in older torch
    nccl_version = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch " \
           f"{torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl_version}"
