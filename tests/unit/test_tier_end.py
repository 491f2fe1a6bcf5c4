"""The supervisor's side of the memory tier at a run's end (supervisor/tier_end.py): the exit
line and the requeue wait for the verdict on where the newest state is; a stop whose
checkpoint is only in memory is not requeued (issue 25, finding 8)."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

from cycler import AtomicDirectory, atomic_torch_save
from cycler.protocol.exit_codes import EXIT_NOT_PERSISTED, EXIT_REQUEUE
from cycler.supervisor.options import RunOptions
from cycler.supervisor.tier_end import STOP_COPY_MARGIN_SECONDS, TierEnd, sigint_came
from cycler.supervisor.vocabulary import Event, Log, Requeue, SignalReceived, Tick


class Said:
    """What the tier's end recorded and whether it requeued, in order."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def record(self, event: str, warning: bool = False, **fields: Any) -> None:
        self.done.append(event)

    def requeue(self) -> None:
        self.done.append("REQUEUED")


def stopped_run(tmp_path: Path, persisted: bool) -> tuple[TierEnd, Said]:
    options = RunOptions(script=tmp_path / "t.py", checkpoint_dir=tmp_path / "ck",
                         memory_tier=True, memory_dir=tmp_path / "shm")
    assert options.memory_layout is not None
    options.layout.root.mkdir()
    saver = AtomicDirectory(options.memory_layout.root)
    directory = saver.prepare_checkpoint_directory()
    atomic_torch_save({"step": 1}, f"{directory}/train.pt")
    saver.symlink_latest(directory)
    if persisted:
        from cycler.checkpoint.durable_copy import persist

        persist(options.memory_layout, options.layout,
                options.memory_layout.parse(Path(directory).name))
    said = Said()
    end = TierEnd(options, said.record, said.requeue)
    exit_line = Log("exit", {"code": EXIT_REQUEUE, "reason": "stopped"})
    assert end.holds(Requeue()) and end.holds(exit_line)
    assert not end.holds(Log("signal", {})), "only the exit line and the requeue wait"
    return end, said


def test_a_stop_whose_checkpoint_landed_is_requeued_after_the_check_then_said(
        tmp_path: Path) -> None:
    end, said = stopped_run(tmp_path, persisted=True)
    assert end.finish(EXIT_REQUEUE, stopped=True) == (EXIT_REQUEUE, None)
    assert said.done == ["REQUEUED", "exit"]


def test_a_stop_whose_checkpoint_is_only_in_memory_exits_74_and_is_not_requeued(
        tmp_path: Path) -> None:
    end, said = stopped_run(tmp_path, persisted=False)
    code, line = end.finish(EXIT_REQUEUE, stopped=True)
    assert code == EXIT_NOT_PERSISTED and line is not None
    assert "only in this node's memory" in line and "not requeued" in line, line
    assert "REQUEUED" not in said.done
    assert said.done == ["persist_failed", "requeue_withheld", "exit"]


def test_a_stop_whose_checkpoint_did_not_land_is_copied_then_requeued_while_time_is_left(
        tmp_path: Path) -> None:
    end, said = stopped_run(tmp_path, persisted=False)
    assert end.finish(EXIT_REQUEUE, stopped=True, deadline=time.time() + 30) == (EXIT_REQUEUE,
                                                                                  None)
    assert said.done == ["stop_copy", "stop_copy_landed", "REQUEUED", "exit"]


def test_a_stop_with_less_than_the_margin_left_copies_nothing_and_exits_74(
        tmp_path: Path) -> None:
    end, said = stopped_run(tmp_path, persisted=False)
    deadline = time.time() + STOP_COPY_MARGIN_SECONDS / 2
    assert end.finish(EXIT_REQUEUE, stopped=True, deadline=deadline)[0] == EXIT_NOT_PERSISTED
    assert said.done == ["persist_failed", "requeue_withheld", "exit"]


def test_a_sigint_left_in_the_queue_after_the_loop_means_stop_now() -> None:
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    for event in (SignalReceived("SIGTERM", 1.0), Tick(2.0)):
        events.put(event)
    assert not sigint_came(events), "a repeated SIGTERM is no reason to give the copy up"
    events.put(SignalReceived("SIGINT", 3.0))
    assert sigint_came(events)
