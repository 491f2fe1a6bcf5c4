"""CommitRounds: a saver's prepare and commit rounds across ranks, each rank a thread with a
fake coordinator over one in-process store (no process group)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from saver_fakes import FakeCoordinator, on_every_rank

from cycler.checkpoint import commit
from cycler.checkpoint.commit import CommitRounds
from cycler.checkpoint.layout import MANIFEST_NAME, CheckpointLayout
from cycler.checkpoint.listing import latest_checkpoint
from cycler.checkpoint.manifest import commit_plan, read_manifest, share_of_plan
from cycler.checkpoint.nodes.node_commit import JOB_MANIFEST_NAME
from cycler.checkpoint.nodes.topology import Nodes
from cycler.checkpoint.placement import Placement
from cycler.checkpoint.tiers import MemoryTier
from cycler.errors import CheckpointDirectoryError, RankFailed


def rounds_of(coordinator: FakeCoordinator, root: Path,
              strategy: str = "sync_any") -> tuple[CommitRounds, Placement]:
    """One rank's rounds over the checkpoint root ``root`` (no memory tier)."""
    placement = Placement(CheckpointLayout(root), None, None)
    return CommitRounds(coordinator, placement, strategy), placement


def saved(coordinator: FakeCoordinator, root: Path, force_save: bool = False) -> Path:
    """One rank's part of a save up to its commit: the prepare round, then this rank's file."""
    rounds, placement = rounds_of(coordinator, root)
    path = Path(rounds.prepare(force_save, lambda pinned, _: placement.create(pinned)))
    (path / f"rank{coordinator.rank}.pt").write_bytes(b"x" * (coordinator.rank + 1))
    return path


def commit_on_every_rank(root: Path, world_size: int, metadata: dict[str, Any] | None = None,
                         ) -> tuple[list[tuple[Any, BaseException | None]], list[int]]:
    """A save committed by every rank: per rank its (path, returned size) or its error, and the
    ranks whose ``committed`` hook ran."""
    hooked: list[int] = []

    def save_and_commit(coordinator: FakeCoordinator) -> tuple[Path, int | None]:
        path = saved(coordinator, root)
        rounds, _ = rounds_of(coordinator, root)
        return path, rounds.commit(path, metadata, lambda: hooked.append(coordinator.rank))

    return on_every_rank(world_size, save_and_commit), hooked


@pytest.mark.parametrize(("strategy", "pinned"), [("sync_any", True), ("sync_all", False)])
def test_the_prepare_round_makes_one_directory_on_rank_0_and_every_rank_gets_its_path(
        tmp_path: Path, strategy: str, pinned: bool) -> None:
    made: list[tuple[int, bool, list[str]]] = []

    def prepare(coordinator: FakeCoordinator) -> str:
        rounds, placement = rounds_of(coordinator, tmp_path, strategy)

        def create(pin: bool, votes: list[str]) -> Path:
            made.append((coordinator.rank, pin, votes))
            return placement.create(pin)

        return rounds.prepare(coordinator.rank == 2, create)  # only rank 2 asks to pin

    outcomes = on_every_rank(3, prepare)
    assert [error for _, error in outcomes] == [None] * 3
    assert len({path for path, _ in outcomes}) == 1
    assert made == [(0, pinned, ["0", "0", "1"])]
    assert Path(outcomes[0][0]).name.endswith("_force") is pinned


def test_a_commit_seals_every_rank_s_files_links_it_and_returns_the_size_on_rank_0(
        tmp_path: Path) -> None:
    outcomes, hooked = commit_on_every_rank(tmp_path, 3, {"step": 7})
    assert [error for _, error in outcomes] == [None] * 3
    path = outcomes[0][0][0]
    assert [size for (_, size), _ in outcomes] == [6, None, None]
    manifest = read_manifest(path)
    assert {f: r.size for f, r in manifest.files.items()} == {
        "rank0.pt": 1, "rank1.pt": 2, "rank2.pt": 3}
    assert manifest.metadata["step"] == 7 and manifest.world_size == 3
    assert latest_checkpoint(tmp_path) == path
    assert sorted(hooked) == [0, 1, 2]


def test_consecutive_commits_leave_only_the_last_rounds_keys_in_the_store(
        tmp_path: Path) -> None:
    """The store lives as long as the job: a round's keys go once every rank is past them."""
    counts = []

    def three_saves(coordinator: FakeCoordinator) -> None:
        for _ in range(3):
            path = saved(coordinator, tmp_path)
            rounds_of(coordinator, tmp_path)[0].commit(path, None, lambda: None)
            if coordinator.rank == 0:
                counts.append(len(coordinator._store.keys()))

    assert [error for _, error in on_every_rank(2, three_saves)] == [None] * 2
    assert counts[1] == counts[2], counts


def test_only_rank_0_lists_the_checkpoint_and_every_rank_records_its_share_of_the_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W ranks listing W files each would read W^2 entries in all."""
    import threading

    listed: list[str] = []
    real = commit.checkpoint_files

    def checkpoint_files(directory: Path) -> list[str]:
        listed.append(threading.current_thread().name)
        return real(directory)

    monkeypatch.setattr(commit, "checkpoint_files", checkpoint_files)
    outcomes, _ = commit_on_every_rank(tmp_path, 3)
    assert [error for _, error in outcomes] == [None] * 3
    assert listed == ["rank-0"]
    assert set(read_manifest(outcomes[0][0][0]).files) == {"rank0.pt", "rank1.pt", "rank2.pt"}


def test_the_commit_plan_gives_each_rank_its_own_shards_by_name_and_every_file_to_one_rank(
        ) -> None:
    regular = [f"{parent}__{rank}_{n}.distcp" for parent in ("", "model/")
               for rank in range(3) for n in range(2)]
    irregular = ["optim/__0_0.distcp", "optim/__2_0.distcp", "__7_0.distcp.tmp",
                 "model/__01_0.distcp"]  # not as a rank would spell its own
    names = sorted([*regular, *irregular, ".metadata", "rank1.pt"])
    plan = commit_plan(names, 3)
    assert plan["shards"] == {"": 2, "model": 2}
    assert plan["others"] == sorted([*irregular, ".metadata", "rank1.pt"])
    shares = [share_of_plan(plan, rank, 3) for rank in range(3)]
    assert sorted(name for share in shares for name in share) == names
    assert shares[1][:4] == ["__1_0.distcp", "__1_1.distcp", "model/__1_0.distcp",
                             "model/__1_1.distcp"]
    assert commit_plan(regular, 4)["shards"] == {}  # rank 3 wrote none: listed, spread


def failing_share(failing_rank: int, error: BaseException) -> Any:
    """``record_files`` that raises ``error`` on ``failing_rank``'s thread only."""
    import threading

    real = commit.record_files

    def record_files(directory: Path, names: list[str]) -> Any:
        if threading.current_thread().name == f"rank-{failing_rank}":
            raise error
        return real(directory, names)

    return record_files


def test_a_rank_that_cannot_record_its_files_fails_the_commit_on_every_rank_with_its_text(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit, "record_files", failing_share(1, OSError(5, "Input/output error")))
    outcomes, hooked = commit_on_every_rank(tmp_path, 3)
    errors = [error for _, error in outcomes]
    assert all(isinstance(error, RankFailed) for error in errors), errors
    assert str(errors[0]) == "the commit failed on rank 1: [Errno 5] Input/output error"
    assert all("the commit failed on rank 1" in str(error) for error in errors[1:])
    assert hooked == [] and CheckpointLayout(tmp_path).link_target_name() is None
    assert not list(tmp_path.glob(f"*/{MANIFEST_NAME}"))


def test_a_rank_interrupted_while_recording_lets_no_rank_wait_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit, "record_files", failing_share(2, KeyboardInterrupt()))
    outcomes, hooked = commit_on_every_rank(tmp_path, 3)
    errors = [error for _, error in outcomes]
    assert isinstance(errors[2], KeyboardInterrupt)
    assert isinstance(errors[0], RankFailed) and "rank 2: KeyboardInterrupt" in str(errors[0])
    assert isinstance(errors[1], RankFailed) and "rank 2: KeyboardInterrupt" in str(errors[1])
    assert hooked == [] and CheckpointLayout(tmp_path).link_target_name() is None


def test_rank_0_s_failure_to_link_reaches_every_follower_at_once(tmp_path: Path) -> None:
    CheckpointLayout(tmp_path).link_path.mkdir()  # a copy that followed the link
    outcomes, hooked = commit_on_every_rank(tmp_path, 2)
    errors = [error for _, error in outcomes]
    assert isinstance(errors[0], CheckpointDirectoryError)
    assert isinstance(errors[1], RankFailed)
    assert str(errors[1]) == f"rank 0 failed: CheckpointDirectoryError: {errors[0]}"
    assert hooked == []


def test_a_directory_the_prepare_round_did_not_make_is_refused_on_every_rank(
        tmp_path: Path) -> None:
    stray = tmp_path / "elsewhere"
    stray.mkdir()

    def commit_stray(coordinator: FakeCoordinator) -> int | None:
        return rounds_of(coordinator, tmp_path)[0].commit(stray, None, lambda: None)

    errors = [error for _, error in on_every_rank(2, commit_stray)]
    assert isinstance(errors[0], ValueError) and "prepare_checkpoint_directory" in str(errors[0])
    assert isinstance(errors[1], RankFailed) and "ValueError" in str(errors[1])
    assert not (stray / MANIFEST_NAME).exists()


def test_a_lone_process_commits_without_a_store(tmp_path: Path) -> None:
    coordinator = FakeCoordinator()
    path = saved(coordinator, tmp_path)
    assert rounds_of(coordinator, tmp_path)[0].commit(path, None, lambda: None) == 1
    assert json.loads((path / MANIFEST_NAME).read_text())["world_size"] == 1


# --- in the memory tier of several nodes: two nodes of two ranks, each node its memory root ----


def on_two_nodes(tmp_path: Path) -> list[tuple[Any, BaseException | None]]:
    """A save prepared and committed by the 4 ranks of two nodes in memory: per rank its path
    (its node's copy) and what its commit returned, or its error."""
    durable = CheckpointLayout(tmp_path / "disk")
    durable.root.mkdir()

    def save_and_commit(coordinator: FakeCoordinator) -> tuple[Path, int | None]:
        nodes = Nodes(node=coordinator.rank // 2, count=2, local_rank=coordinator.rank % 2,
                      local_size=2)
        memory = tmp_path / f"memory-node{nodes.node}"
        memory.mkdir(exist_ok=True)
        placement = Placement(durable, MemoryTier(memory, 1), nodes)
        rounds = CommitRounds(coordinator, placement, "sync_any")
        path = Path(rounds.prepare(False, placement.create))
        (path / f"rank{coordinator.rank}.pt").write_bytes(b"x" * (coordinator.rank + 1))
        return path, rounds.commit(path, {"step": 5}, lambda: None)

    return on_every_rank(4, save_and_commit)


def test_on_several_nodes_every_node_commits_its_own_files_under_the_job_s_manifest(
        tmp_path: Path) -> None:
    outcomes = on_two_nodes(tmp_path)
    assert [error for _, error in outcomes] == [None] * 4
    paths = [path for (path, _), _ in outcomes]
    assert len({path.name for path in paths}) == 1  # the rounds agree on one checkpoint
    assert [path.parent.name for path in paths] == ["memory-node0"] * 2 + ["memory-node1"] * 2
    assert [size for (_, size), _ in outcomes] == [1 + 2, None, 3 + 4, None]  # the leaders
    for node, files in ((0, {"rank0.pt", "rank1.pt"}), (1, {"rank2.pt", "rank3.pt"})):
        path = paths[2 * node]
        assert latest_checkpoint(path.parent) == path
        assert set(read_manifest(path).files) == files | {JOB_MANIFEST_NAME}
        sidecar = json.loads((path / JOB_MANIFEST_NAME).read_text())
        assert sorted(sidecar["files"]) == [f"rank{rank}.pt" for rank in range(4)]
    assert latest_checkpoint(tmp_path / "disk") is None  # nothing persisted yet


def test_a_node_without_room_sends_the_checkpoint_to_the_checkpoint_root_on_every_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def has_room(tier: MemoryTier, needed: int) -> bool:
        return tier.root.name != "memory-node1"

    monkeypatch.setattr(MemoryTier, "has_room", has_room)
    outcomes = on_two_nodes(tmp_path)
    assert [error for _, error in outcomes] == [None] * 4
    paths = {path for (path, _), _ in outcomes}
    assert len(paths) == 1 and next(iter(paths)).parent == tmp_path / "disk"
    path = next(iter(paths))
    assert set(read_manifest(path).files) == {f"rank{rank}.pt" for rank in range(4)}
    assert latest_checkpoint(tmp_path / "disk") == path
    for node in (0, 1):
        assert latest_checkpoint(tmp_path / f"memory-node{node}") is None
