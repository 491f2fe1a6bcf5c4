"""Persister: the memory tier's background work after each commit in memory, on one node (the
persisting thread is real; a copy is held where a test needs it in flight)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from saver_fakes import checkpoint, indices

from cycler.checkpoint import durable_copy, persisting
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.persisting import Persister
from cycler.checkpoint.tiers import MemoryTier
from cycler.errors import ConfigError

HELD = 30.0
"""The longest a held copy waits to be let go: never reached by a test that passes."""


def persister_of(tmp_path: Path, *, keep_last: int = -1, every: int = 2,
                 ) -> tuple[Persister, CheckpointLayout, CheckpointLayout]:
    memory = CheckpointLayout(tmp_path / "memory")
    durable = CheckpointLayout(tmp_path / "disk")
    durable.root.mkdir()
    return Persister(MemoryTier(memory.root, every), memory, durable, None, keep_last), \
        memory, durable


def committed(persister: Persister, memory: CheckpointLayout, index: int, *,
              pinned: bool = False, stop: bool = False) -> CheckpointName:
    """A checkpoint committed in memory, handed to the persister as the saver does."""
    path = checkpoint(memory, index, pinned=pinned)
    persister.after_commit(path.name, stop)
    name = memory.parse(path.name)
    assert name is not None
    return name


def hold_first_copy(monkeypatch: pytest.MonkeyPatch,
                    while_held: Callable[[], None] = lambda: None,
                    ) -> tuple[threading.Event, threading.Event]:
    """Hold the persisting thread in its first file copy until the returned ``release`` is set
    (``entered`` is set once it is held); ``while_held`` runs on that thread then."""
    entered, release = threading.Event(), threading.Event()
    real = durable_copy.copy_durably

    def copy_durably(source: Path, target: Path, abandon: Any = durable_copy.never_abandon) -> None:
        if not entered.is_set():
            entered.set()
            while_held()
            assert release.wait(HELD)
        real(source, target, abandon)

    monkeypatch.setattr(durable_copy, "copy_durably", copy_durably)
    return entered, release


def copies_in(durable: CheckpointLayout) -> list[str]:
    """Every entry of the checkpoint root named for a checkpoint, hidden temporaries too."""
    return sorted(p.name for p in durable.root.iterdir() if "checkpoint_" in p.name)


def test_every_k_th_checkpoint_is_persisted_and_each_root_keeps_what_its_rule_says(
        tmp_path: Path) -> None:
    persister, memory, durable = persister_of(tmp_path, keep_last=2)
    for index in range(6):
        committed(persister, memory, index)
        persister.finish()
    assert indices(durable.root) == ["2", "4"]  # 0, 2, 4 persisted; keep_last 2 there
    assert indices(memory.root) == ["4", "5"]  # the newest two in memory
    assert durable.link_target_name() == durable.parse("AtomicDirectory_checkpoint_4")
    assert persister.busy == set()


def test_a_copy_queued_behind_a_newer_one_is_skipped_but_a_pinned_one_never(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    persister, memory, durable = persister_of(tmp_path)
    entered, release = hold_first_copy(monkeypatch)
    committed(persister, memory, 0)
    assert entered.wait(HELD)
    committed(persister, memory, 1, pinned=True)
    committed(persister, memory, 2)  # stands for 0 had it not started: 0 is copied on
    committed(persister, memory, 3)
    committed(persister, memory, 4)  # stands for 2
    release.set()
    persister.finish()
    assert indices(durable.root) == ["0", "1P", "4"]
    assert persister.busy == set()


def test_a_persist_in_flight_gives_way_to_the_stop_s_and_leaves_no_copy_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    persister, memory, durable = persister_of(tmp_path)

    def the_stop_commits() -> None:
        # What the stop's after_commit sets before it waits (it cannot be called here: it
        # waits for this very thread): the copy in flight reads it between two chunks.
        persister._stop_index = 3

    entered, release = hold_first_copy(monkeypatch, the_stop_commits)
    release.set()
    with caplog.at_level(logging.INFO, logger="cycler.checkpoint.persisting"):
        committed(persister, memory, 2)
        persister.finish()
    assert entered.is_set() and "gave way to the stop's" in caplog.text
    assert indices(durable.root) == [] and copies_in(durable) == []
    committed(persister, memory, 3, stop=True)  # a stop's persist is waited for
    assert indices(durable.root) == ["3"] and persister.busy == set()


def test_a_memory_checkpoint_that_does_not_match_its_checksums_is_not_persisted_and_the_next_is(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    persister, memory, durable = persister_of(tmp_path)
    path = checkpoint(memory, 0)
    (path / "model.pt").write_bytes(b"weights X")  # same size, other bytes: damaged memory
    with caplog.at_level(logging.WARNING, logger="cycler.checkpoint.persisting"):
        persister.after_commit(path.name, stop=False)
        persister.finish()
    assert "checkpoint 0 was not persisted" in caplog.text and "checksum" in caplog.text
    assert copies_in(durable) == []
    committed(persister, memory, 2)
    persister.finish()
    assert indices(durable.root) == ["2"] and persister.busy == set()


def test_leaving_the_memory_tier_waits_for_the_copies_queued(tmp_path: Path) -> None:
    persister, memory, durable = persister_of(tmp_path, every=1)
    for index in range(3):
        committed(persister, memory, index)
    persister.before_leaving()
    assert indices(durable.root)[-1] == "2" and persister.queued is None


def test_a_keep_last_that_would_keep_nothing_is_refused_when_the_persister_is_made(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keep_last=0 would keep no checkpoint") as refused:
        persister_of(tmp_path, keep_last=0)
    assert "\n" not in str(refused.value)


def test_a_pinned_checkpoint_queued_behind_a_copy_stays_in_memory_until_it_is_persisted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    persister, memory, durable = persister_of(tmp_path, every=100)
    entered, release = hold_first_copy(monkeypatch)
    committed(persister, memory, 0)
    assert entered.wait(HELD)
    committed(persister, memory, 1, pinned=True)
    for index in range(2, 6):  # memory keeps the newest two: 1P only while it is queued
        committed(persister, memory, index)
    release.set()
    persister.finish()
    assert indices(durable.root) == ["0", "1P"]
    assert indices(memory.root) == ["4", "5"] and persister.busy == set()


def released_when_waited_for(persister: Persister, release: threading.Event,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy held by :func:`hold_first_copy` goes on once the saver waits for the persister
    (nothing else lets it go: a wait that never comes leaves it held)."""
    finish = persister.finish

    def released_then_finished() -> None:
        release.set()
        finish()

    monkeypatch.setattr(persister, "finish", released_then_finished)


def test_a_stop_persists_its_checkpoint_once_and_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    persister, memory, durable = persister_of(tmp_path, every=2)
    copied: list[int] = []
    real = persisting.persist

    def persist(memory: CheckpointLayout, durable: CheckpointLayout, name: CheckpointName,
                abandon: Any) -> None:
        copied.append(name.index)
        real(memory, durable, name, abandon)

    monkeypatch.setattr(persisting, "persist", persist)
    _, release = hold_first_copy(monkeypatch)
    released_when_waited_for(persister, release, monkeypatch)
    try:
        committed(persister, memory, 4, stop=True)  # an every-K-th one too: copied once
        assert indices(durable.root) == ["4"] and persister.queued is None
    finally:
        release.set()
        persister.wait()
    assert copied == [4] and persister.busy == set()


def test_leaving_the_memory_tier_during_a_stop_gives_up_the_older_copy_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    persister, memory, durable = persister_of(tmp_path)
    entered, release = hold_first_copy(monkeypatch)
    committed(persister, memory, 0)
    assert entered.wait(HELD)
    monkeypatch.setattr(persisting, "stopping", lambda: True)
    released_when_waited_for(persister, release, monkeypatch)
    with caplog.at_level(logging.INFO, logger="cycler.checkpoint.persisting"):
        persister.before_leaving()
    assert "gave way to the stop's" in caplog.text
    assert indices(durable.root) == [] and copies_in(durable) == []
