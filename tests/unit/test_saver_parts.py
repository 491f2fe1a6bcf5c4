"""The saver's parts alone, without a process group: placement across tiers and retention."""

from __future__ import annotations

from pathlib import Path

from cycler.checkpoint.layout import CheckpointLayout
from cycler.checkpoint.linking import finalize
from cycler.checkpoint.listing import list_checkpoints
from cycler.checkpoint.manifest import sealed
from cycler.checkpoint.placement import Placement
from cycler.checkpoint.retainer import Retainer
from cycler.checkpoint.tiers import MemoryTier


def committed(layout: CheckpointLayout, placement: Placement) -> Path:
    """A checkpoint made where ``placement`` puts the next one, then committed there."""
    path = placement.create(pinned=False)
    (path / "model.pt").write_bytes(b"weights")
    name = layout.parse(path.name)
    assert name is not None
    placement.wait_recorded()
    finalize(layout, name, sealed(path, index=name.index))
    return path


def test_placement_gives_growing_indices_in_the_checkpoint_root_without_a_memory_tier(
        tmp_path: Path) -> None:
    durable = CheckpointLayout(tmp_path)
    placement = Placement(durable, None, None)
    placement.ensure_roots()
    assert placement.hold_writer_lock() and not placement.hold_writer_lock()
    paths = [committed(durable, placement) for _ in range(3)]
    assert [p.name for p in paths] == [f"AtomicDirectory_checkpoint_{i}" for i in range(3)]
    assert not placement.in_memory_tier() and placement.tiers() == [durable]
    placement.release()


def test_leaving_the_memory_tier_runs_its_hook_first_and_indices_go_on_above_both_tiers(
        tmp_path: Path) -> None:
    durable = CheckpointLayout(tmp_path / "durable")
    tier = MemoryTier(tmp_path / "memory")
    memory = CheckpointLayout(tier.root)
    left: list[str] = []
    placement = Placement(durable, tier, None,
                          before_leaving=lambda: left.append(str(placement.layout.root)))
    placement.ensure_roots()
    assert committed(memory, placement).parent == tier.root
    assert committed(memory, placement).parent == tier.root
    placement.leave_memory_tier("a test")
    assert left == [str(tier.root)], "the hook runs while the memory root is still the layout"
    assert not placement.in_memory_tier() and placement.layout is durable
    assert committed(durable, placement).name == "AtomicDirectory_checkpoint_2"


def test_the_retainer_keeps_the_last_k_and_removes_a_prepared_directory_never_committed(
        tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path)
    placement = Placement(layout, None, None)
    retainer = Retainer(keep_last=2)
    for _ in range(2):
        retainer.after_commit(layout, committed(layout, placement).name)
    abandoned = placement.create(pinned=False)  # a save that failed before its commit
    retainer.prepared(abandoned)
    for _ in range(2):
        path = committed(layout, placement)
        retainer.prepared(path)
        retainer.committed(path)
        retainer.after_commit(layout, path.name)
    assert not abandoned.exists()
    assert [c.index for c in list_checkpoints(tmp_path) if c.valid] == [3, 4]


def test_the_retainer_scans_the_new_root_once_the_saver_commits_there(tmp_path: Path) -> None:
    first, second = CheckpointLayout(tmp_path / "a"), CheckpointLayout(tmp_path / "b")
    retainer = Retainer(keep_last=1)
    for layout in (first, second):
        placement = Placement(layout, None, None)
        placement.ensure_roots()
        old = committed(layout, placement)  # committed by an earlier run of the job
        retainer.after_commit(layout, committed(layout, placement).name)
        assert not old.exists(), f"{layout.root} was scanned at its first commit"
