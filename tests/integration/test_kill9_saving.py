"""Real ``kill -9`` of processes in the middle of saving through AtomicDirectory.

A harness process imports torch once, then per trial forks a saver that resumes from the latest
checkpoint and commits checkpoints in a loop (``keep_last=2``, ~300 KB of tensors written with
``atomic_torch_save``, ``metadata={"step": step}``), reporting each step on a pipe once its
commit returned. After a random delay of at most the time a saver takes to its second commit
(measured as it goes: 30-150 ms here, depending on load) the harness SIGKILLs it and records
what a resuming process would see. The test then asserts, for every kill: the latest checkpoint
loads and holds its manifest's step, no step reported committed is lost, the previous committed
checkpoint survives beside it, and a kill never corrupts anything; then that one clean commit
clears every torn directory and temporary the kills left.

Run as a script, this file is the harness: ``python test_kill9_saving.py ROOT KILLS SEED OUT``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

KEEP_LAST = 2
FLOATS = 40_000  # two files of 160 KB each per checkpoint


def expected_weights(step: int) -> Any:
    import torch

    return torch.randn(FLOATS, generator=torch.Generator().manual_seed(step))


def save_forever(root: Path, report_fd: int) -> None:
    """The saver: resume from the latest checkpoint, then commit step after step until killed."""
    import torch

    from cycler.checkpoint.atomic_directory import AtomicDirectory
    from cycler.checkpoint.manifest import read_manifest
    from cycler.checkpoint.saving import atomic_torch_save

    saver = AtomicDirectory(root, keep_last=KEEP_LAST)
    latest = saver.latest_checkpoint()
    step = 0 if latest is None else int(read_manifest(Path(latest)).step or 0) + 1
    while True:
        path = Path(saver.prepare_checkpoint_directory())
        atomic_torch_save(
            {"step": torch.tensor(step), "weights": expected_weights(step)}, path / "model.pt"
        )
        atomic_torch_save({"momentum": expected_weights(step) * 2}, path / "optimizer.pt")
        saver.symlink_latest(path, metadata={"step": step})
        os.write(report_fd, f"{step} {time.monotonic()}\n".encode())
        step += 1


def kill_one_saver(root: Path, delay: float) -> tuple[list[int], list[float]]:
    """Fork a saver and SIGKILL it after ``delay`` seconds: the steps it reported committed,
    and when (seconds after the fork)."""
    read_end, write_end = os.pipe()
    forked = time.monotonic()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        try:
            save_forever(root, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    time.sleep(delay)
    os.kill(child, signal.SIGKILL)
    _, status = os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as pipe:
        reports = [line.split() for line in pipe.read().decode().splitlines()]
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise RuntimeError(f"the saver ended by itself (status {status}) before it was killed")
    return [int(step) for step, _ in reports], [float(at) - forked for _, at in reports]


class KillTimer:
    """Random kill delays spanning a saver's first two commits, however fast this machine is
    right now: a fixed range would kill every saver before its first commit under load, and
    torn directories would pile up until the one commit that clears them never finishes."""

    def __init__(self, seed: int) -> None:
        self.chooser = random.Random(seed)
        self.spans = [0.150]

    def delay(self) -> float:
        return self.chooser.uniform(0.005, self.span())

    def span(self) -> float:
        recent = sorted(self.spans[-9:])
        return recent[len(recent) // 2]

    def learn(self, commit_times: list[float]) -> None:
        if len(commit_times) >= 2:
            self.spans.append(commit_times[1])
        elif commit_times:
            self.spans.append(2 * commit_times[0])
        else:
            self.spans.append(min(1.5 * self.span(), 2.0))


def observe(root: Path) -> dict[str, Any]:
    """What a process resuming right now would find."""
    import torch

    from cycler._fs import is_temporary
    from cycler.checkpoint.listing import latest_checkpoint, list_checkpoints

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        latest = latest_checkpoint(root)
    found = list_checkpoints(root, verify=True)
    observed: dict[str, Any] = {
        "warnings": [str(w.message) for w in caught],
        "states": {c.path.name: c.state.value for c in found},
        "steps": {c.path.name: c.manifest.step for c in found if c.manifest is not None},
        "temporaries": sorted(
            str(Path(d, n).relative_to(root))
            for d, dirs, files in os.walk(root)
            for n in dirs + files
            if is_temporary(n)
        ),
        "latest": None if latest is None else latest.name,
    }
    if latest is not None:
        model = torch.load(latest / "model.pt", weights_only=True)
        optimizer = torch.load(latest / "optimizer.pt", weights_only=True)
        step = int(model["step"])
        observed["loaded_step"] = step
        observed["content_matches_step"] = bool(
            torch.equal(model["weights"], expected_weights(step))
            and torch.equal(optimizer["momentum"], expected_weights(step) * 2)
        )
    return observed


def harness(root: Path, kills: int, seed: int, out: Path) -> None:
    import torch

    import cycler.checkpoint.atomic_directory
    import cycler.checkpoint.listing
    import cycler.checkpoint.saving

    # Imported once here so that every forked saver starts saving at once.
    del cycler
    torch.set_num_threads(1)
    expected_weights(0)
    timer = KillTimer(seed)
    last_reported = -1
    with open(out, "w") as records:
        for kill in range(kills):
            reported, commit_times = kill_one_saver(root, timer.delay())
            timer.learn(commit_times)
            last_reported = max([last_reported, *reported])
            record = {
                "kill": kill,
                "reported": reported,
                "last_reported": last_reported,
                **observe(root),
            }
            records.write(json.dumps(record) + "\n")


def run_kills(tmp_path: Path, kills: int) -> list[dict[str, Any]]:
    seed = random.randrange(1 << 30)
    out = tmp_path / "records.jsonl"
    started = time.monotonic()
    subprocess.run(
        [sys.executable, __file__, str(tmp_path / "root"), str(kills), str(seed), str(out)],
        check=True,
        timeout=600,
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    print(f"{kills} kills (seed {seed}) in {time.monotonic() - started:.1f} s")
    assert len(records) == kills, f"seed {seed}"
    return records


def check_every_kill(records: list[dict[str, Any]]) -> None:
    previous_latest_step = -1
    linked = False
    for record in records:
        context = json.dumps(record)
        states, steps = record["states"], record["steps"]
        # Once made, the link is never left broken; before, a first checkpoint may have been
        # sealed by a saver killed before its first link swap.
        if linked or record["latest"] is None:
            assert record["warnings"] == [], context
        else:
            assert all("latest_checkpoint is missing" in w for w in record["warnings"]), context
        linked = linked or (record["latest"] is not None and not record["warnings"])
        assert "corrupt" not in states.values(), context  # a kill can only leave a torn dir
        if record["last_reported"] < 0 and record["latest"] is None:
            continue
        latest, step = record["latest"], record["loaded_step"]
        assert states[latest] == "latest" and steps[latest] == step, context
        assert record["content_matches_step"], context
        # A saver killed after its commit but before its report adds one unreported step.
        assert record["last_reported"] <= step, context
        assert previous_latest_step <= step <= max(record["last_reported"],
                                                   previous_latest_step) + 1, context
        previous_latest_step = step
        if step >= 1:  # keep_last=2: the previous commit (or a sealed twin of this step) stays
            older = [steps[name] for name, state in states.items() if state == "valid"]
            assert any(s in (step - 1, step) for s in older), context


def check_the_kills_landed_mid_save(records: list[dict[str, Any]]) -> None:
    torn = sum(1 for r in records
               if "incomplete" in r["states"].values() or r["temporaries"])
    committed = records[-1]["last_reported"] + 1
    print(f"{torn} of {len(records)} kills left a torn directory or a temporary; "
          f"{committed} checkpoints committed")
    assert torn >= len(records) // 5
    assert committed >= len(records) // 5


def check_one_clean_commit_clears_every_leftover(root: Path, records: list[dict[str, Any]]) -> None:
    from cycler._fs import is_temporary
    from cycler.checkpoint.atomic_directory import AtomicDirectory
    from cycler.checkpoint.listing import list_checkpoints

    saver = AtomicDirectory(root, keep_last=KEEP_LAST)
    step = records[-1]["loaded_step"] + 1
    saver.symlink_latest(saver.prepare_checkpoint_directory(), metadata={"step": step})
    found = list_checkpoints(root, verify=True)
    assert [c.state.value for c in found] == ["valid", "latest"]
    assert [c.manifest.step for c in found if c.manifest] in ([step - 1, step], [step, step])
    leftovers = [n for _, dirs, files in os.walk(root) for n in dirs + files if is_temporary(n)]
    assert leftovers == []


def test_a_hundred_real_kills_mid_save_never_lose_a_committed_checkpoint(tmp_path: Path) -> None:
    records = run_kills(tmp_path, kills=100)
    check_every_kill(records)
    check_the_kills_landed_mid_save(records)
    check_one_clean_commit_clears_every_leftover(tmp_path / "root", records)


@pytest.mark.slow
def test_a_thousand_real_kills_mid_save_never_lose_a_committed_checkpoint(tmp_path: Path) -> None:
    records = run_kills(tmp_path, kills=1000)
    check_every_kill(records)
    check_the_kills_landed_mid_save(records)
    check_one_clean_commit_clears_every_leftover(tmp_path / "root", records)


if __name__ == "__main__":
    harness(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
