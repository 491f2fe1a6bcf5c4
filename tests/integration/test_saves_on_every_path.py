"""Issue 16, the savers' paths off the torture track, on real processes (gloo, 2 ranks).

- An asynchronous save as a script's last line is committed before the processes end, also when
  the script destroys its process group right after it (how most torch scripts end).
- An exception of any kind on one rank inside a commit round fails every rank at once, with
  its text, instead of leaving the others waiting for the saver's timeout.
- ``save()``/``load()`` honour the saver's strategy: ``mono`` (rank 0 alone), ``async`` (a saver
  per rank), ``offline`` (no process group).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import free_port, run_on_every_rank

from cycler import AtomicDirectory, latest_checkpoint, read_manifest
from cycler.errors import RankFailed

LAST_LINE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from cycler import AtomicDirectory
    root, ending = sys.argv[1], sys.argv[2]
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    saver = AtomicDirectory(root)
    saver.save({"w": torch.full((1 << 22,), 3.0)}, metadata={"step": 7}, asynchronous=True)
    if ending == "destroy" and dist.is_initialized():
        dist.destroy_process_group()
""")


def start_ranks(script: str, world_size: int, *args: str) -> list[subprocess.Popen[str]]:
    port = free_port()
    processes = []
    for rank in range(world_size):
        env = dict(os.environ)
        if world_size > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), LOCAL_RANK=str(rank))
        processes.append(subprocess.Popen([sys.executable, "-c", script, *args], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
    return processes


def finish(processes: list[subprocess.Popen[str]], timeout: float = 90) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    results = []
    for process in processes:
        try:
            _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            pytest.fail("a rank hung at exit")
        results.append((process.returncode, err))
    return results


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("ending", ["end", "destroy"])
def test_an_async_save_as_the_scripts_last_line_is_committed_before_exit(
        tmp_path: Path, world_size: int, ending: str) -> None:
    root = tmp_path / "root"
    results = finish(start_ranks(LAST_LINE, world_size, str(root), ending))
    assert all(code == 0 for code, _ in results), results
    assert not any("Traceback" in err for _, err in results), results
    latest = latest_checkpoint(root)
    assert latest is not None and read_manifest(latest).step == 7
    assert read_manifest(latest).world_size == world_size
    loaded = {"w": torch.zeros(1 << 22)}
    AtomicDirectory(root).load(loaded)
    assert torch.equal(loaded["w"], torch.full((1 << 22,), 3.0))


FAILING_AT_EXIT = textwrap.dedent("""
    import sys, torch
    from cycler import AtomicDirectory
    saver = AtomicDirectory(sys.argv[1])
    saver.save({"w": torch.ones(4)}, metadata={"not json": object()}, asynchronous=True)
""")


def test_an_async_save_that_fails_at_exit_ends_the_process_non_zero_saying_so(
        tmp_path: Path) -> None:
    [(code, err)] = finish(start_ranks(FAILING_AT_EXIT, 1, str(tmp_path / "root")))
    assert code == 1
    assert "asynchronous save" in err and "was not committed" in err and "JSON" in err


TIMEOUT = datetime.timedelta(seconds=60)


def check_an_error_on_rank_1_inside_the_commit_fails_rank_0_at_once(root: Path) -> None:
    import cycler.checkpoint.commit as commit

    saver = AtomicDirectory(root, timeout=TIMEOUT)
    if dist.get_rank() == 1:
        def broken(*args: object) -> None:
            raise KeyError("a bug on rank 1")
        commit.record_files = broken  # a non-OSError of the library's own
    path = Path(saver.prepare_checkpoint_directory())
    torch.save({"rank": dist.get_rank()}, path / f"rank-{dist.get_rank()}.pt")
    started = time.monotonic()
    with pytest.raises(RankFailed) as raised:
        saver.symlink_latest(path)
    assert time.monotonic() - started < 20, "a rank waited for the timeout"
    assert "a bug on rank 1" in str(raised.value)


def check_mono_saves_and_loads_on_rank_0_alone(root: Path) -> None:
    if dist.get_rank() == 0:
        saver = AtomicDirectory(root, strategy="mono", timeout=TIMEOUT)
        saver.save({"w": torch.full((8,), 5.0)}, metadata={"step": 3})
        saver.save({"w": torch.full((8,), 6.0)}, metadata={"step": 4}, asynchronous=True)
        saver.wait()
        state = {"w": torch.zeros(8)}
        assert saver.load(state) == {"step": 4}
        assert torch.equal(state["w"], torch.full((8,), 6.0))
    dist.barrier()


def check_async_strategy_saves_and_loads_each_ranks_own_state(root: Path) -> None:
    rank = dist.get_rank()
    saver = AtomicDirectory(root, strategy="async", timeout=TIMEOUT)
    saver.save({"w": torch.full((8,), float(rank))}, metadata={"step": rank})
    dist.barrier()
    state = {"w": torch.zeros(8)}
    assert AtomicDirectory(root, strategy="async", timeout=TIMEOUT).load(state) == {"step": rank}
    assert torch.equal(state["w"], torch.full((8,), float(rank)))


def check_offline_saves_and_loads_in_one_process_of_a_group(root: Path) -> None:
    if dist.get_rank() == 0:
        saver = AtomicDirectory(root, strategy="offline", timeout=TIMEOUT)
        saver.save({"w": torch.full((8,), 9.0)}, metadata={"step": 9})
        state = {"w": torch.zeros(8)}
        assert saver.load(state) == {"step": 9}
        assert torch.equal(state["w"], torch.full((8,), 9.0))
    dist.barrier()


def test_an_error_of_any_kind_on_one_rank_fails_every_rank_of_the_commit_at_once(
        tmp_path: Path) -> None:
    run_on_every_rank(__name__, "check_an_error_on_rank_1_inside_the_commit_fails_rank_0_at_once",
                      root=tmp_path)


@pytest.mark.parametrize("check", [
    "check_mono_saves_and_loads_on_rank_0_alone",
    "check_async_strategy_saves_and_loads_each_ranks_own_state",
    "check_offline_saves_and_loads_in_one_process_of_a_group",
])
def test_save_and_load_honour_every_strategy(tmp_path: Path, check: str) -> None:
    run_on_every_rank(__name__, check, root=tmp_path)


def check_a_flip_in_rank_1s_share_makes_every_rank_fall_back_together(root: Path) -> None:
    import warnings

    from cycler import CheckpointWarning

    rank = dist.get_rank()
    saver = AtomicDirectory(root, timeout=TIMEOUT)
    for step in (1, 2):
        # A key of its own per rank: rank 1's shard holds rank 1's tensor.
        saver.save({f"w{rank}": torch.full((1 << 16,), float(step + rank))},
                   metadata={"step": step})
    dist.barrier()
    if rank == 0:
        shard = root / "AtomicDirectory_checkpoint_1" / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01  # only rank 1 reads this file when verifying
        shard.write_bytes(bytes(data))
    dist.barrier()
    state = {f"w{rank}": torch.zeros(1 << 16)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert AtomicDirectory(root, timeout=TIMEOUT).load(state) == {"step": 1}
    said = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    assert len(said) == 1 and "rank 1" in said[0] and "checksum" in said[0], said
    chosen = torch.tensor([float(state[f"w{rank}"][0]) - rank])
    everyone = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(everyone, chosen)
    assert everyone[0] == everyone[1] == 1.0  # both loaded step 1
    dist.barrier()
    if rank == 0:
        assert latest_checkpoint(root) == root / "AtomicDirectory_checkpoint_0"


def test_resume_verifies_each_ranks_share_and_a_failed_share_makes_all_fall_back(
        tmp_path: Path) -> None:
    run_on_every_rank(__name__,
                      "check_a_flip_in_rank_1s_share_makes_every_rank_fall_back_together",
                      root=tmp_path)


def check_store_keys_do_not_grow_with_commits(root: Path) -> None:
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    saver = AtomicDirectory(root, keep_last=1, timeout=TIMEOUT)
    counts = []
    for step in range(12):
        path = Path(saver.prepare_checkpoint_directory())
        torch.save({"step": step}, path / f"rank-{dist.get_rank()}.pt")
        saver.symlink_latest(path, metadata={"step": step})
        dist.barrier()
        counts.append(store.num_keys())
    assert counts[-1] <= counts[2], counts


def test_the_stores_keys_of_commit_rounds_are_deleted_once_every_rank_is_past_them(
        tmp_path: Path) -> None:
    run_on_every_rank(__name__, "check_store_keys_do_not_grow_with_commits", root=tmp_path)
