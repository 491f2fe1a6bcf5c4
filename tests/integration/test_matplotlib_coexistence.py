"""torch-cycler and matplotlib (whose dependency ``cycler`` has the same import name) in one
fresh environment, installed in either order: matplotlib's ``cycler`` behaves as before, every
public name of this project imports, ``cycle`` runs, and uninstalling either side leaves the
other working. Real venvs (not --system-site-packages), real pip, this project's real wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integrations

ROOT = Path(__file__).resolve().parents[2]
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
"""The venvs' own site-packages only: never this checkout's cycler."""
MATPLOTLIB_SIDE = (
    "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
    "from cycler import cycler, Cycler, concat\n"
    "c = cycler(color='rgb') + cycler(lw=[1, 2, 3])\n"
    "assert isinstance(c, Cycler) and len(c) == 3 and list(c)[1] == {'color': 'g', 'lw': 2}\n"
    "assert len(concat(cycler(a=[1]), cycler(a=[2]))) == 2\n"
    "plt.plot([1, 2], [3, 4]); plt.gcf().savefig('plot.png')\n"
)
OUR_SIDE = (
    "import cycler\n"
    "from cycler import AtomicDirectory, StepControl, latest_checkpoint, EXIT_REQUEUE\n"
    "from cycler.integrations.loop import LoopState\n"
    "assert cycler.IS_TORCH_CYCLER and all(hasattr(cycler, n) for n in cycler.__all__)\n"
    "print(StepControl().step().step, EXIT_REQUEUE)\n"
)


def pip(venv: Path, *args: str) -> None:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "-q", *args],
                          capture_output=True, text=True, timeout=900, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr


def works(venv: Path, code: str) -> bool:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, cwd=venv, timeout=300, env=ENV)
    return done.returncode == 0


def cycle_runs(venv: Path) -> bool:
    done = subprocess.run([str(venv / "bin" / "cycle"), "--version"], capture_output=True,
                          text=True, timeout=120, env=ENV)
    return done.returncode == 0 and "torch-cycler" in done.stdout


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A fresh venv with torch only, and this project's wheel (built once for every order)."""
    base = tmp_path_factory.mktemp("coexistence")
    wheels = base / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(wheels), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    venv = base / "template"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip(venv, "install", "torch==2.13.0")  # first and pinned, as README says
    yield venv, next(wheels.glob("torch_cycler-*.whl"))


@pytest.mark.parametrize("order", [("matplotlib", "ours"), ("ours", "matplotlib")])
def test_both_work_in_either_order_and_survive_the_others_uninstall(
        template: tuple[Path, Path], tmp_path: Path, order: tuple[str, str]) -> None:
    venv = tmp_path / "venv"
    shutil.copytree(template[0], venv, symlinks=True)
    packages = {"matplotlib": "matplotlib", "ours": str(template[1])}
    for side in order:
        pip(venv, "install", packages[side])
    assert works(venv, MATPLOTLIB_SIDE) and works(venv, OUR_SIDE) and cycle_runs(venv)
    pip(venv, "uninstall", "-y", "cycler")  # matplotlib's dependency alone
    assert works(venv, OUR_SIDE) and cycle_runs(venv)
    pip(venv, "install", "cycler")
    pip(venv, "uninstall", "-y", "torch-cycler")
    assert works(venv, MATPLOTLIB_SIDE)
