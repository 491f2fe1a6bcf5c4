"""The memory tier on several nodes, with real gloo ranks laid out as torchrun lays out two nodes
of two ranks (each node its own memory root): node manifests, the partner copy over the leaders'
group, persisting by contribution, and the resume that takes a wiped node's files from its
partner's copy, verified."""

from __future__ import annotations

import datetime
import os
import shutil
import stat
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_on_every_rank

from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import CheckpointWarning, inspect_checkpoint
from cycler.checkpoint.manifest import check_files, read_manifest
from cycler.checkpoint.memory_roots import memory_root
from cycler.checkpoint.nodes.assembly import assembly_plan
from cycler.checkpoint.nodes.node_commit import JOB_MANIFEST_NAME, node_files
from cycler.checkpoint.nodes.partner_copy import replica_path
from cycler.checkpoint.saving import atomic_torch_save
from cycler.protocol.environment import ENV_MEMORY_TIER, ENV_PERSIST_EVERY

PER_NODE = 2
WORLD_SIZE = 4


def _node() -> int:
    return dist.get_rank() // PER_NODE


def _on_node(root: Path, persist_every: int) -> Path:
    """This rank's memory tier: one base directory per node, as on separate machines."""
    durable = root / "checkpoints"
    os.environ[ENV_MEMORY_TIER] = str(memory_root(root / f"memory-node{_node()}", durable))
    os.environ[ENV_PERSIST_EVERY] = str(persist_every)
    return durable


def _saver(durable: Path) -> AtomicDirectory:
    return AtomicDirectory(durable, keep_last=2, timeout=datetime.timedelta(seconds=60))


def _save(saver: AtomicDirectory, step: int) -> Path:
    """Every rank writes its own file; rank 0 also the shared one, as examples/train.py."""
    directory = Path(saver.prepare_checkpoint_directory())
    rank = dist.get_rank()
    atomic_torch_save({"rank": rank, "step": step, "data": torch.full((1000,), step * 10 + rank)},
                      directory / f"rank-{rank}.pt")
    if rank == 0:
        atomic_torch_save({"step": step, "weights": torch.arange(2000) * step},
                          directory / "train.pt")
    saver.symlink_latest(directory, metadata={"step": step})
    return directory


def _memory(durable: Path) -> CheckpointLayout:
    return CheckpointLayout(os.environ[ENV_MEMORY_TIER])


def _name(index: int) -> CheckpointName:
    return CheckpointName("AtomicDirectory", index, False)


def _loads_as_saved(directory: Path, step: int) -> None:
    rank = dist.get_rank()
    own = torch.load(directory / f"rank-{rank}.pt", weights_only=True)
    shared = torch.load(directory / "train.pt", weights_only=True)
    assert own["step"] == step and torch.equal(own["data"], torch.full((1000,), step * 10 + rank))
    assert shared["step"] == step and torch.equal(shared["weights"], torch.arange(2000) * step)


NODE_FILES = {0: ["rank-0.pt", "rank-1.pt", "train.pt"], 1: ["rank-2.pt", "rank-3.pt"]}


def check_each_node_commits_its_files_keeps_its_partners_and_every_kth_is_persisted(
        root: Path) -> None:
    durable = _on_node(root, persist_every=3)
    saver = _saver(durable)
    for step in range(5):
        _save(saver, step)
    saver.wait_for_persisting()
    dist.barrier()
    memory, node = _memory(durable), _node()
    if dist.get_rank() % PER_NODE == 0:
        newest = memory.path_of(_name(4))
        assert memory.link_target_name() == _name(4)
        assert inspect_checkpoint(memory, _name(4), verify=True).valid
        assert node_files(newest) == NODE_FILES[node]
        job = read_manifest(newest)  # the node manifest
        assert JOB_MANIFEST_NAME in job.files
        # The partner's files of the same checkpoint, verified, under .replicas/.
        copy = replica_path(memory, _name(4))
        assert node_files(copy) == NODE_FILES[1 - node]
        assert check_files(copy, read_manifest(copy), checksums=True) is None
        # Memory keeps the newest two, and the partner copies of those only.
        assert [n.index for n in memory.checkpoint_names()] == [3, 4]
        assert sorted(p.name for p in (memory.root / ".replicas").iterdir()) == [
            str(_name(3)), str(_name(4))]
    # Every 3rd persisted, whole, by the two nodes' contributions: 0 and 3.
    layout = CheckpointLayout(durable)
    assert [n.index for n in layout.checkpoint_names()] == [0, 3]
    assert layout.link_target_name() == _name(3)
    persisted = read_manifest(layout.path_of(_name(3)))
    assert sorted(persisted.files) == sorted(NODE_FILES[0] + NODE_FILES[1])
    assert check_files(layout.path_of(_name(3)), persisted, checksums=True) is None
    assert persisted.world_size == WORLD_SIZE and persisted.metadata == {"step": 3}
    dist.barrier()


def _saved(durable: Path, steps: int) -> CheckpointLayout:
    """Checkpoints 0 .. steps - 1 saved and copied to the partner; this node's memory."""
    saver = _saver(durable)
    for step in range(steps):
        _save(saver, step)
    saver.wait_for_persisting()
    del saver
    dist.barrier()
    return _memory(durable)


def check_a_node_whose_memory_was_wiped_resumes_from_its_partners_copy(root: Path) -> None:
    durable = _on_node(root, persist_every=100)
    memory = _saved(durable, 3)
    if dist.get_rank() == PER_NODE:  # node 1's memory is gone (node replaced, tmpfs wiped)
        shutil.rmtree(memory.root)
    dist.barrier()
    saver = _saver(durable)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # no fallback
        latest = saver.latest_checkpoint()
    # Checkpoint 2 was only in memory (only 0 was persisted): node 1's files came from node 0.
    assert latest == str(memory.path_of(_name(2)))
    assert [n.index for n in CheckpointLayout(durable).checkpoint_names()] == [0]
    _loads_as_saved(Path(latest), 2)
    assert sorted(read_manifest(Path(latest)).files) == sorted(NODE_FILES[0] + NODE_FILES[1])
    # Training goes on above it, on both nodes.
    assert Path(_save(saver, 3)).name == str(_name(3))
    saver.wait_for_persisting()
    dist.barrier()


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def check_a_corrupt_memory_copy_falls_back_to_an_older_one_then_to_the_checkpoint_root(
        root: Path) -> None:
    durable = _on_node(root, persist_every=100)
    memory = _saved(durable, 4)  # memory: 2 and 3; the checkpoint root: 0
    if dist.get_rank() == PER_NODE:  # one bit of node 1's own copy of checkpoint 3 flips
        _flip_a_bit(memory.path_of(_name(3)) / "rank-2.pt")
    dist.barrier()
    with pytest.warns(CheckpointWarning,
                      match="node 1: damaged: rank-2.pt does not match its checksum"):
        latest = _saver(durable).latest_checkpoint()
    assert latest == str(memory.path_of(_name(2)))  # the older memory one, not the disk's 0
    _loads_as_saved(Path(latest), 2)
    dist.barrier()
    if dist.get_rank() == PER_NODE:  # and node 1's copy of 2 too: only the disk's 0 is whole
        _flip_a_bit(memory.path_of(_name(2)) / "rank-3.pt")
    dist.barrier()
    with pytest.warns(CheckpointWarning, match="rank-3.pt does not match its checksum"):
        latest = _saver(durable).latest_checkpoint()
    assert latest == str(CheckpointLayout(durable).path_of(_name(0)))
    _loads_as_saved(Path(latest), 0)
    dist.barrier()


def _state(step: int) -> dict[str, torch.Tensor]:
    rank = dist.get_rank()
    return {"shared": torch.arange(5000.0) * step,  # the same on every rank: rank 0 writes it
            f"own-{rank}": torch.full((100,), float(step * 10 + rank))}  # in rank's own file


def check_dcp_saves_sync_and_async_resume_on_a_node_whose_memory_was_wiped(root: Path) -> None:
    durable = _on_node(root, persist_every=100)
    saver = _saver(durable)
    saver.save(_state(0))
    saver.save(_state(1), {"step": 1}, asynchronous=True).wait()
    saver.save(_state(2), {"step": 2}, asynchronous=True).wait()
    saver.wait_for_persisting()
    del saver
    dist.barrier()
    memory = _memory(durable)
    if dist.get_rank() == 0:  # node 0 held DCP's .metadata and the shared tensor: all gone
        shutil.rmtree(memory.root)
    dist.barrier()
    saver = _saver(durable)
    own = f"own-{dist.get_rank()}"
    state = {"shared": torch.zeros(5000), own: torch.zeros(100)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        assert saver.load(state) == {"step": 2}
    assert torch.equal(state["shared"], _state(2)["shared"])
    assert torch.equal(state[own], _state(2)[own])
    assert (memory.path_of(_name(2)) / ".metadata").is_file()
    # A checkpoint asked for by index (--resume-from, Dragon's rollback) is assembled the same
    # way: 1 was only in memory, and node 0 held none of it any more.
    assert saver.load(state, checkpoint=1) == {"step": 1}
    assert torch.equal(state[own], _state(1)[own])
    assert torch.equal(state["shared"], _state(1)["shared"])
    dist.barrier()


def check_partner_copies_are_private_whatever_the_umask(root: Path) -> None:
    os.umask(0)  # a user's umask of 000: nothing another user could reach may be open
    durable = _on_node(root, persist_every=100)
    saver = _saver(durable)
    for step in range(2):
        _save(saver, step)
    saver.wait_for_persisting()
    dist.barrier()
    memory = _memory(durable)
    if dist.get_rank() % PER_NODE == 0:
        assert replica_path(memory, _name(1)).is_dir()
        for path in [memory.root, *memory.root.rglob("*")]:
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                assert stat.S_IMODE(mode) == 0o700, (path, oct(mode))
            elif stat.S_ISREG(mode) and ".tmp" not in path.name:
                assert stat.S_IMODE(mode) == 0o600, (path, oct(mode))
    dist.barrier()


def test_partner_copies_are_private_whatever_the_umask(tmp_path: Path) -> None:
    run_on_every_rank(__name__, "check_partner_copies_are_private_whatever_the_umask",
                      root=tmp_path, world_size=WORLD_SIZE, per_node=PER_NODE)


def test_two_nodes_commit_copy_to_their_partner_and_persist_together(tmp_path: Path) -> None:
    run_on_every_rank(
        __name__,
        "check_each_node_commits_its_files_keeps_its_partners_and_every_kth_is_persisted",
        "check_a_node_whose_memory_was_wiped_resumes_from_its_partners_copy",
        "check_a_corrupt_memory_copy_falls_back_to_an_older_one_then_to_the_checkpoint_root",
        "check_dcp_saves_sync_and_async_resume_on_a_node_whose_memory_was_wiped",
        root=tmp_path, world_size=WORLD_SIZE, per_node=PER_NODE)


def _layout() -> CheckpointLayout:
    return CheckpointLayout("/nowhere")


def _held(**checkpoints: tuple[list[str], list[str]]) -> str:
    import json

    from cycler.checkpoint.manifest import FileRecord, make_manifest

    job = make_manifest({f: FileRecord(1, "0") for f in ["a", "b", "c"]}, index=0,
                        world_size=2, metadata={}, version="")
    return json.dumps({name: {"own": own, "copy": copy, "job": job.to_json()}
                       for name, (own, copy) in checkpoints.items()})


def test_the_plan_fetches_each_missing_file_from_a_node_that_wrote_it_before_a_copy() -> None:
    name = "AtomicDirectory_checkpoint_5"
    plan = assembly_plan({0: _held(**{name: (["a", "b"], ["c"])}),
                          1: _held(**{name: (["c"], ["a", "b"])}),
                          2: _held()}, _layout(), durable_newest=3, requested=None)
    assert plan["name"] == name
    # Node 2 (memory wiped) gets a and b from node 0 and c from node 1, both their own files;
    # nodes 0 and 1 hold everything already (own or partner copy).
    assert plan["fetch"] == [[0, 2, "a", "own"], [0, 2, "b", "own"], [1, 2, "c", "own"]]


def test_the_plan_takes_an_older_checkpoint_when_a_file_is_nowhere_and_none_older_than_disk(
        ) -> None:
    older, newer = "AtomicDirectory_checkpoint_4", "AtomicDirectory_checkpoint_5"
    inventories = {0: _held(**{older: (["a", "b"], ["c"]), newer: (["a", "b"], [])}),
                   1: _held(**{older: (["c"], []), newer: ([], [])})}
    plan = assembly_plan(inventories, _layout(), durable_newest=3, requested=None)
    assert plan["name"] == older and plan["fetch"] == [[0, 1, "a", "own"], [0, 1, "b", "own"]]
    assert assembly_plan(inventories, _layout(), durable_newest=5, requested=None)["name"] is None
    assert assembly_plan(inventories, _layout(), durable_newest=-1,
                         requested=newer)["name"] is None


CONTRIBUTOR = """
import sys
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.nodes.contribution import contribute
memory, durable, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("copying", flush=True)
contribute(CheckpointLayout(memory), CheckpointLayout(durable),
           CheckpointName("AtomicDirectory", index, False))
"""


def _node_checkpoints(memories: list[CheckpointLayout], index: int, mb: int) -> None:
    """Checkpoint ``index`` as two nodes commit it: each node's memory root holds its own
    files (four of ``mb`` MB each) under its node manifest, with the job's manifest."""
    from cycler.checkpoint.linking import finalize
    from cycler.checkpoint.manifest import make_manifest, record_files
    from cycler.checkpoint.nodes.node_commit import node_manifest

    files: dict[int, list[str]] = {}
    records = {}
    for node, memory in enumerate(memories):
        directory = memory.path_of(_name(index))
        directory.mkdir(parents=True)
        files[node] = [f"part-{node * 4 + part}.bin" for part in range(4)]
        for file in files[node]:
            (directory / file).write_bytes(os.urandom(mb << 20))
        records.update(record_files(directory, files[node]))
    job = make_manifest(records, index=index, world_size=2, metadata={"step": index},
                        version="")
    for node, memory in enumerate(memories):
        directory = memory.path_of(_name(index))
        finalize(memory, _name(index), node_manifest(directory, job, files[node]))


def test_kill_9_of_both_nodes_contributions_never_commits_a_partial_checkpoint(
        tmp_path: Path) -> None:
    """Both nodes persist their halves of checkpoint 1 at once and are killed with SIGKILL at
    random moments: the durable link names checkpoint 0 or a whole checkpoint 1, never a
    partial one; contributions after the kills complete it."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from cycler.checkpoint.listing import list_checkpoints
    from cycler.checkpoint.nodes.contribution import contribute

    memories = [CheckpointLayout(tmp_path / f"memory-node{node}") for node in (0, 1)]
    durable = CheckpointLayout(tmp_path / "checkpoints")
    durable.root.mkdir()
    _node_checkpoints(memories, 0, 1)
    assert not contribute(memories[0], durable, _name(0))  # node 1's half is missing
    assert contribute(memories[1], durable, _name(0))  # the contribution that completes seals
    _node_checkpoints(memories, 1, 8)
    rng = random.Random(11)
    kills = 0
    for _ in range(10):
        processes = [subprocess.Popen([sys.executable, "-c", CONTRIBUTOR, str(memory.root),
                                       str(durable.root), "1"], stdout=subprocess.PIPE,
                                      text=True) for memory in memories]
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == "copying\n"
        time.sleep(rng.uniform(0.0, 0.12))
        for process in processes:
            process.send_signal(signal.SIGKILL)
        kills += sum(process.wait() == -signal.SIGKILL for process in processes)
        checkpoints = {c.index: c for c in list_checkpoints(durable.root)}
        assert checkpoints[0].valid
        assert all(c.valid or not c.committed for c in checkpoints.values()), checkpoints
        assert durable.link_target_name() in (_name(0), _name(1))
        if durable.link_target_name() == _name(1):
            assert inspect_checkpoint(durable, _name(1), verify=True).valid
            break
    print("contributions killed:", kills)
    assert kills >= 2
    complete = [contribute(memory, durable, _name(1)) for memory in memories]
    assert complete[-1] and durable.link_target_name() == _name(1)
    # A contributor killed between the manifest's rename and the link's: the next one links.
    from cycler import _fs

    _fs.atomic_symlink(durable.path_of(_name(0)), durable.link_path)
    assert contribute(memories[0], durable, _name(1))
    assert durable.link_target_name() == _name(1)
    assert inspect_checkpoint(durable, _name(1), verify=True).valid
    assert read_manifest(durable.path_of(_name(1))).metadata == {"step": 1}


def test_at_the_job_end_each_node_contributes_and_the_newest_whole_checkpoint_is_committed(
        tmp_path: Path) -> None:
    """What each node's `cycle run` does when its workers are gone: node 1 committed checkpoint
    1 but died before committing 2, which only node 0 holds. Node 1 contributes its half of 1;
    node 0 tries 2 (never whole: nothing is committed) and then 1, which its half completes."""
    from cycler.checkpoint.nodes.contribution import contribute_newest

    memories = [CheckpointLayout(tmp_path / f"memory-node{node}") for node in (0, 1)]
    durable = CheckpointLayout(tmp_path / "checkpoints")
    durable.root.mkdir()
    _node_checkpoints(memories, 1, 1)
    _node_checkpoints(memories, 2, 1)
    shutil.rmtree(memories[1].path_of(_name(2)))
    assert contribute_newest(memories[1], durable) is None  # node 0's half of 1 is missing
    assert durable.link_target_name() is None
    assert contribute_newest(memories[0], durable) == _name(1)
    assert durable.link_target_name() == _name(1)
    assert inspect_checkpoint(durable, _name(1), verify=True).valid
    assert not inspect_checkpoint(durable, _name(2)).committed  # torn, never linked
    assert contribute_newest(memories[0], durable) is None  # nothing newer to give


def test_after_a_stop_each_node_copies_its_share_in_time_and_a_share_given_up_commits_nothing(
        tmp_path: Path) -> None:
    """What each node's `cycle run` does after a stop whose contributions were cut: node 0's
    share given up at the deadline keeps only the file it had verified and renamed in (no
    temporary, nothing committed: exit 74 there); then each node copies its share in time:
    node 0's finishes its part, node 1's completes and commits the checkpoint (75 on both)."""
    from cycler.checkpoint.job_end import finish_job
    from cycler.checkpoint.listing import list_checkpoints
    from cycler.protocol.exit_codes import EXIT_NOT_PERSISTED, EXIT_REQUEUE

    memories = [CheckpointLayout(tmp_path / f"memory-node{node}") for node in (0, 1)]
    durable = CheckpointLayout(tmp_path / "checkpoints")
    durable.root.mkdir()
    _node_checkpoints(memories, 1, 1)
    calls = iter(range(10**6))  # past the deadline from the second file's first chunk on
    cut = finish_job(memories[0], durable, several_nodes=True, exit_code=EXIT_REQUEUE,
                     stopped=True, copy_until=2.0, clock=lambda: float(next(calls)))
    assert cut.failure is not None and "reached the stop's deadline" in cut.failure
    assert cut.exit_code(EXIT_REQUEUE) == EXIT_NOT_PERSISTED
    assert durable.link_target_name() is None
    left = sorted(p.name for p in durable.path_of(_name(1)).iterdir())
    assert left == ["part-0.bin"], "a file is renamed in only whole and verified"
    ends = [finish_job(memory, durable, several_nodes=True, exit_code=EXIT_REQUEUE,
                       stopped=True, copy_until=time.time() + 60) for memory in memories]
    assert [end.failure for end in ends] == [None, None]
    assert [end.stop_copy is not None for end in ends] == [True, True]
    assert durable.link_target_name() == _name(1)
    assert inspect_checkpoint(durable, _name(1), verify=True).valid
    assert all(c.valid for c in list_checkpoints(durable.root))
