"""``atomic_torch_save`` on its own under real ``kill -9``: the target always loads, and the
temporaries killed writers leave are removed by the next save of the same target."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import torch

from cycler import atomic_torch_save
from cycler._fs import TEMP_MARKER

KILLS = 300


def save_forever(target: Path) -> None:
    weights = torch.randn(256 * 1024)  # 1 MB: the kill often lands between create and rename
    step = 0
    while True:
        atomic_torch_save({"step": step, "weights": weights}, target)
        step += 1


def leftovers(target: Path) -> list[str]:
    return [name for name in os.listdir(target.parent)
            if name.startswith(f".{target.name}{TEMP_MARKER}")]


def test_300_kills_mid_save_leave_a_loadable_file_and_no_temporary_after_the_next_save(
        tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    atomic_torch_save({"step": -1}, target)
    rng = random.Random(9)
    kills_that_left_one = 0
    for _ in range(KILLS):
        child = os.fork()
        if child == 0:
            try:
                save_forever(target)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.03))
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        assert "step" in torch.load(target, weights_only=True)
        left = len(leftovers(target))
        # Each new writer's first save removes what the killed one before it left.
        assert left <= 1, f"{left} temporaries piled up: killed writers' leftovers are kept"
        kills_that_left_one += left
    assert kills_that_left_one > 0, "no kill landed between create and rename: proves nothing"
    atomic_torch_save({"step": "after"}, target)
    assert leftovers(target) == [], "the next save kept a killed writer's temporary"
    assert torch.load(target, weights_only=True)["step"] == "after"


def test_a_live_writers_temporary_and_another_hosts_are_never_removed(tmp_path: Path) -> None:
    from cycler._fs import temporary_sibling

    target = tmp_path / "model.pt"
    live = temporary_sibling(target)  # this process is alive: its temporary is in use
    live.write_bytes(b"")
    other_host = target.with_name(f".{target.name}{TEMP_MARKER}elsewhere-1-1-abcdef")
    other_host.write_bytes(b"")
    atomic_torch_save({"step": 0}, target)
    assert live.exists() and other_host.exists()
