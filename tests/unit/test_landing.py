"""The landing of the newest memory checkpoint at a run's end (supervisor/run_end/landing.py),
reported to the core, which decides the exit and the requeue: a stop whose checkpoint is only in
memory is not requeued (issue 25, finding 8)."""

from __future__ import annotations

import queue
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from cycler import AtomicDirectory, atomic_torch_save
from cycler.protocol.exit_codes import EXIT_NOT_PERSISTED, EXIT_REQUEUE
from cycler.supervisor.configuration.options import RunOptions
from cycler.supervisor.decisions.core import CoreConfig, SupervisorCore
from cycler.supervisor.decisions.vocabulary import (
    CheckpointCommitted,
    Event,
    Exit,
    LandNewest,
    Log,
    Requeue,
    SignalReceived,
    Tick,
    WorkersExited,
)
from cycler.supervisor.run_end.landing import STOP_COPY_MARGIN_SECONDS, Landing, sigint_came


class Said:
    """What the landing recorded, in order."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def record(self, event: str, warning: bool = False, **fields: Any) -> None:
        self.done.append(event)


def stopped_run(tmp_path: Path, persisted: bool) -> tuple[Landing, Said]:
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
    return Landing(options, said.record), said


def stop(deadline: float | None = None) -> LandNewest:
    return LandNewest(EXIT_REQUEUE, stopped=True, deadline=deadline)


def said_by_core(report: Any) -> list[str]:
    """What a core that stopped with a requeue says once ``report`` answers its landing."""
    core = SupervisorCore(replace(CoreConfig(grace=30.0), lands_newest=True, requeue=True))
    core.start(100.0)
    core.handle(SignalReceived("SIGTERM", 150.0))
    core.handle(CheckpointCommitted(1))
    assert [type(a) for a in core.handle(WorkersExited(0, 151.0))] == [Log, LandNewest]
    return [a.event if isinstance(a, Log) else f"Exit {a.code}" if isinstance(a, Exit)
            else type(a).__name__ for a in core.handle(report)]


def test_a_stop_whose_checkpoint_landed_reports_it_and_is_requeued_then_said(
        tmp_path: Path) -> None:
    landing, said = stopped_run(tmp_path, persisted=True)
    report = landing.land(stop())
    assert report.failure is None and said.done == []
    assert said_by_core(report) == [Requeue.__name__, "exit", f"Exit {EXIT_REQUEUE}"]


def test_a_stop_whose_checkpoint_is_only_in_memory_reports_where_and_exits_74(
        tmp_path: Path) -> None:
    landing, said = stopped_run(tmp_path, persisted=False)
    report = landing.land(stop())
    assert report.failure is not None and report.newest is not None
    assert str(tmp_path / "shm") in report.newest and said.done == []
    assert said_by_core(report) == ["persist_failed", "requeue_withheld", "exit",
                                    f"Exit {EXIT_NOT_PERSISTED}"]


def test_a_stop_whose_checkpoint_did_not_land_is_copied_while_time_is_left(
        tmp_path: Path) -> None:
    landing, said = stopped_run(tmp_path, persisted=False)
    report = landing.land(stop(deadline=time.time() + 30))
    assert report.failure is None
    assert said.done == ["stop_copy", "stop_copy_landed"]


def test_a_stop_with_less_than_the_margin_left_copies_nothing(tmp_path: Path) -> None:
    landing, said = stopped_run(tmp_path, persisted=False)
    report = landing.land(stop(deadline=time.time() + STOP_COPY_MARGIN_SECONDS / 2))
    assert report.failure is not None and said.done == []


def test_without_the_memory_tier_nothing_is_landed(tmp_path: Path) -> None:
    said = Said()
    landing = Landing(RunOptions(script=tmp_path / "t.py", checkpoint_dir=tmp_path / "ck"),
                      said.record)
    assert landing.land(stop()).failure is None and said.done == []


def test_a_sigint_left_in_the_queue_after_the_loop_means_stop_now() -> None:
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    for event in (SignalReceived("SIGTERM", 1.0), Tick(2.0)):
        events.put(event)
    assert not sigint_came(events), "a repeated SIGTERM is no reason to give the copy up"
    events.put(SignalReceived("SIGINT", 3.0))
    assert sigint_came(events)
