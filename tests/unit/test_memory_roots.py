"""prepare_memory_root when the ranks of a node prepare the same memory root at once (library
use, no ``cycle run`` before them): one at a time, so that none takes the record another rank
has just written for another job's and removes the root under the others (a CI failure of
test_memory_tier_nodes: "cannot prepare the memory root ... memory-owner.json (No such file or
directory)")."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import time
from pathlib import Path

from cycler.checkpoint.memory_roots import memory_root, prepare_memory_root
from cycler.protocol.record import RunRecord


def _prepare(durable: Path, root: Path, start: multiprocessing.synchronize.Barrier,
             failures: multiprocessing.Queue) -> None:
    start.wait()
    try:
        prepare_memory_root(root, RunRecord(durable))
    except Exception as error:  # noqa: BLE001 - the parent counts them
        failures.put(repr(error))
    else:
        failures.put("")


def test_four_ranks_preparing_one_root_at_once_all_succeed_and_keep_one_record(
        tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    said = []
    for attempt in range(150):  # before the lock: a rank failed in ~1 of 100 such attempts
        durable = tmp_path / str(attempt) / "checkpoints"
        root = memory_root(tmp_path / str(attempt) / "memory", durable)
        start, failures = context.Barrier(4), context.Queue()
        ranks = [context.Process(target=_prepare, args=(durable, root, start, failures))
                 for _ in range(4)]
        for rank in ranks:
            rank.start()
        said += [failures.get(timeout=60) for _ in ranks]
        for rank in ranks:
            rank.join(timeout=60)
        assert (root / ".cycler" / "memory-owner.json").is_file()
    assert [line for line in said if line] == []


def test_a_rank_waits_while_another_prepares_the_root(tmp_path: Path) -> None:
    durable = tmp_path / "checkpoints"
    root = memory_root(tmp_path / "memory", durable)
    prepare_memory_root(root, RunRecord(durable))
    context = multiprocessing.get_context("fork")
    start, failures = context.Barrier(2), context.Queue()
    # Started before the lock is taken, so that it does not inherit the locked descriptor.
    rank = context.Process(target=_prepare, args=(durable, root, start, failures))
    rank.start()
    descriptor = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(descriptor, fcntl.LOCK_EX)  # another rank, in the middle of preparing it
    start.wait()
    time.sleep(1)
    assert rank.is_alive() and failures.empty()
    os.close(descriptor)
    assert failures.get(timeout=30) == ""
    rank.join(timeout=30)
