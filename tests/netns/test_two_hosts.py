"""`cycle run` nodes on simulated hosts (network namespaces on one bridge, one address each, one
shared checkpoint directory), running examples/train.py with one worker per node over gloo.

On four hosts, one job goes through every way a node can fail or stop, run after run, and must
end as the same training uninterrupted:
- a worker on node 2 is killed with SIGKILL while the others wait for it in a collective:
  torchrun restarts every node's workers together from the newest checkpoint;
- node 0's supervisor alone gets SIGTERM: every other node reads the stop in the job's store and
  asks its own workers, all stop at one agreed step and exit 75 right after its checkpoint;
- node 1's supervisor is killed with SIGKILL: its watchdog ends node 1's processes, and the
  others notice the silence and end their own workers within seconds (``--node-timeout``), not
  after a rendezvous or collective timeout, with exit 75 and the reason;
- node 0's supervisor is killed with SIGKILL: the others' torchruns fail on the lost rendezvous
  store, and they wait for the heartbeats' verdict and exit 75, not 1 (issue 17).

On two hosts: ten worker kills in one job; a hang on node 1; a node that never starts is named
within ``--start-timeout``, and a node that comes after the other failed in the same run finds
that at once; a worker that crashes after its training loop on node 1, while node 0 finishes,
ends the job as finished instead of restarting into a rendezvous node 0 never joins; the memory
tier's partner copy; node 0's loss in a few lines; a node thawed after the node timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
from hosts import Host

from cycler import EXIT_FAILURE, EXIT_REQUEUE, EXIT_SUCCESS, latest_checkpoint, read_manifest
from cycler.checkpoint.layout import CheckpointLayout
from cycler.checkpoint.manifest import check_files
from cycler.checkpoint.memory_roots import memory_base, memory_root
from cycler.checkpoint.nodes.node_commit import node_files
from cycler.checkpoint.nodes.partner_copy import replica_path
from cycler.protocol.events import read_events
from cycler.protocol.record import RunRecord

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train.py"
HANG_WORKER = REPO / "tests" / "integration" / "hang_worker.py"
REPLAY_WORKER = REPO / "tests" / "integration" / "replay_worker.py"
TRAIN_ARGS = ["--epochs", "3", "--samples", "2048", "--hidden", "32", "--checkpoint-every", "8",
              "--step-delay", "0.05"]
NODE_TIMEOUT = 5.0


class Node:
    """One node's ``cycle run`` on its host, output in a file."""

    def __init__(self, host: Host, rank: int, master: Host, root: Path, final: Path,
                 port: int, train_args: list[str] = TRAIN_ARGS, script: Path = EXAMPLE,
                 flags: tuple[str, ...] = (), nnodes: int = 2) -> None:
        self.rank = rank
        self.output = root.parent / f"{root.name}-node{rank}-{time.monotonic_ns()}.txt"
        command = host.command(
            sys.executable, "-m", "cycler_cli", "run", "--nnodes", str(nnodes),
            "--node-rank", str(rank), "--nproc-per-node", "1", "--master-addr", master.address,
            "--master-port", str(port), "--local-addr", host.address, "--checkpoint-dir",
            str(root), "--grace", "60",
            "--node-timeout", str(NODE_TIMEOUT), "--no-requeue", *flags, str(script),
            *train_args, *(["--final-weights", str(final)] if script == EXAMPLE
                           else ["--out", str(final)]))
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("SLURM_", "CYCLER_", "MASTER_"))}
        # gloo finds its own address through the host name, which no namespace resolves.
        environment.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=host.interface)
        with self.output.open("wb") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                            env=environment, cwd=REPO)

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait(self, timeout: float = 180.0) -> int:
        return self.process.wait(timeout)

    def worker(self) -> psutil.Process:
        """The training process under this node's torchrun."""
        for process in psutil.Process(self.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                line = " ".join(process.cmdline())
                if str(EXAMPLE) in line and "cycler" not in line:
                    return process
        raise AssertionError(f"node {self.rank} has no worker: {self.text()}")


@contextlib.contextmanager
def job(hosts: tuple[Host, ...], root: Path, final: Path, train_args: list[str] = TRAIN_ARGS,
        script: Path = EXAMPLE, flags: tuple[str, ...] = (),
        node_flags: tuple[tuple[str, ...], ...] = ()) -> Iterator[list[Node]]:
    port = 29000 + os.getpid() % 1000
    node_flags = node_flags or ((),) * len(hosts)
    nodes = [Node(host, rank, hosts[0], root, final, port, train_args, script,
                  flags + node_flags[rank], len(hosts)) for rank, host in enumerate(hosts)]
    try:
        yield nodes
    finally:
        for node in nodes:
            if node.process.poll() is None:
                for process in psutil.Process(node.process.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        process.kill()
                node.process.kill()
                node.process.wait()


def wait_for_text(node: Node, text: str, count: int = 1, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while node.text().count(text) < count:
        assert node.process.poll() is None, f"node {node.rank} ended early:\n{node.text()}"
        assert time.monotonic() < deadline, f"no {text!r} x{count} on node {node.rank}"
        time.sleep(0.1)


def same_weights(reference: Path, final: Path) -> bool:
    expected, actual = torch.load(reference), torch.load(final)
    return all(torch.equal(expected[name], actual[name]) for name in expected)


def assert_same_weights(reference: Path, final: Path) -> None:
    expected, actual = torch.load(reference), torch.load(final)
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


def uninterrupted_hang_worker(hosts: tuple[Host, ...], tmp_path: Path) -> Path:
    """The reference weights of ``hang_worker.py`` on both hosts, with no fault."""
    reference = tmp_path / "reference.pt"
    with job(hosts, tmp_path / "uninterrupted", reference, [], HANG_WORKER) as nodes:
        assert [node.wait() for node in nodes] == [EXIT_SUCCESS, EXIT_SUCCESS]
    return reference


def history(root: Path, node: int) -> list[str]:
    return [record["event"] for record in read_events(RunRecord(root).events_path(node))]


def survivors(tmp_path: Path) -> list[str]:
    """The processes of the jobs under ``tmp_path`` still alive, on any host."""
    found = []
    for process in psutil.process_iter(["cmdline", "status", "pid"]):
        line = " ".join(process.info["cmdline"] or [])
        if process.info["status"] != psutil.STATUS_ZOMBIE and str(tmp_path) in line:
            found.append(f"{process.info['pid']}: {line[:200]}")
    return found


def assert_no_survivor(tmp_path: Path) -> None:
    deadline = time.monotonic() + 5  # a watchdog ends what a killed supervisor left
    while survivors(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not survivors(tmp_path), survivors(tmp_path)


# 192 steps: a job of 48 (TRAIN_ARGS) ended on a fast machine before its fourth run's kill,
# the lost nodes' runs having trained on until the others gave them up.
LONG_TRAIN_ARGS = ["--epochs", "12", "--samples", "2048", "--hidden", "32",
                   "--checkpoint-every", "8", "--step-delay", "0.05"]


@pytest.mark.timeout(900)
def test_four_hosts_restart_together_stop_together_at_the_checkpoint_and_survive_lost_nodes(
        four_hosts: tuple[Host, ...], tmp_path: Path) -> None:
    """Four nodes, one rank each, run after run of one job: a worker killed on node 2 restarts
    every node's workers; a stop asked of node 0 alone reaches every node's workers through
    their own supervisor, each node ends 75 right after the agreed checkpoint (torchrun cut
    short, nothing waits for a deadline); node 1's supervisor killed: the others give it up
    within --node-timeout; node 0's supervisor killed: the others give it up too. Then the job
    ends bit-identical to an uninterrupted one, and no process is left after any run."""
    hosts = four_hosts
    reference = tmp_path / "reference.pt"
    with job(hosts, tmp_path / "uninterrupted", reference, LONG_TRAIN_ARGS) as nodes:
        assert [node.wait() for node in nodes] == [EXIT_SUCCESS] * 4

    root, final = tmp_path / "ck", tmp_path / "final.pt"
    with job(hosts, root, final, LONG_TRAIN_ARGS) as nodes:
        wait_for_text(nodes[0], "[train] training from step")
        time.sleep(1.0)
        nodes[2].worker().kill()  # the others wait for it in, or on their way to, an all-reduce
        wait_for_text(nodes[0], "[train] training from step", count=2)  # node 0 restarted too
        assert "restart_together" in history(root, 2)
        time.sleep(1.0)
        nodes[0].process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        codes = [node.wait() for node in nodes]
        took = time.monotonic() - signalled
        assert codes == [EXIT_REQUEUE] * 4, nodes[1].text()
        for node in nodes[1:]:
            assert "another node's stop: checkpoint_and_exit" in node.text(), node.text()
        for node in nodes:  # none killed at a deadline: each ended at the agreed checkpoint
            assert "code -15" not in node.text() and "are over" not in node.text(), node.text()
            assert "torchrun_cut_short" in history(root, node.rank), node.text()
        assert took < 30, f"the stop took {took:.1f} s: a deadline (the grace is 60 s), not " \
                          "the checkpoint, ended it"
    assert_no_survivor(tmp_path)

    with job(hosts, root, final, LONG_TRAIN_ARGS) as nodes:
        wait_for_text(nodes[0], "[train] training from step")
        time.sleep(1.0)
        nodes[1].process.kill()
        killed_at = time.monotonic()
        codes = [node.wait(timeout=60) for node in (nodes[0], nodes[2], nodes[3])]
        took = time.monotonic() - killed_at
        assert codes == [EXIT_REQUEUE] * 3, nodes[0].text()
        assert took < NODE_TIMEOUT + 10, f"the nodes took {took:.1f} s to give node 1 up"
        assert "node 1 is gone" in nodes[0].text()
    assert_no_survivor(tmp_path)  # node 1's watchdog ended its job

    with job(hosts, root, final, LONG_TRAIN_ARGS) as nodes:
        wait_for_text(nodes[0], "[train] training from step")
        time.sleep(1.0)
        nodes[0].process.kill()  # node 0 hosts the stores: the others' torchruns fail
        killed_at = time.monotonic()
        codes = [node.wait(timeout=60) for node in nodes[1:]]
        took = time.monotonic() - killed_at
        assert codes == [EXIT_REQUEUE] * 3, nodes[1].text()
        assert took < NODE_TIMEOUT + 10, f"the nodes took {took:.1f} s to give node 0 up"
        for node in nodes[1:]:
            assert "node 0 is gone" in node.text(), node.text()
    assert_no_survivor(tmp_path)

    assert latest_checkpoint(root) is not None
    with job(hosts, root, final, LONG_TRAIN_ARGS) as nodes:
        assert [node.wait() for node in nodes] == [EXIT_SUCCESS] * 4, nodes[0].text()
    # Four ranks: bit-identical because examples/train.py settles its DDP buckets
    # (cycler.settle_ddp_buckets; without it a resumed first step sums in another order).
    assert same_weights(reference, final), "the resumed 4-host job ended with other weights"


def test_ten_worker_kills_on_node_1_in_one_job_each_restart_both_nodes_and_end_exactly(
        hosts: tuple[Host, ...], tmp_path: Path) -> None:
    reference = tmp_path / "reference.pt"
    with job(hosts, tmp_path / "uninterrupted", reference, LONG_TRAIN_ARGS) as nodes:
        assert [node.wait(timeout=600) for node in nodes] == [EXIT_SUCCESS, EXIT_SUCCESS]
    root, final = tmp_path / "ck", tmp_path / "final.pt"
    with job(hosts, root, final, LONG_TRAIN_ARGS) as nodes:
        for kill in range(10):
            wait_for_text(nodes[0], "[train] training from step", count=kill + 1)
            time.sleep(1.5)  # both train (and commit) before the next kill
            nodes[1].worker().kill()
        wait_for_text(nodes[0], "[train] training from step", count=11)
        codes = [node.wait(timeout=600) for node in nodes]
        assert codes == [EXIT_SUCCESS, EXIT_SUCCESS], nodes[1].text()[-3000:]
    assert history(root, 1).count("restart_together") >= 10
    assert_same_weights(reference, final)



def test_a_rank_that_hangs_on_node_1_restarts_both_nodes_and_the_job_ends_exactly(
        hosts: tuple[Host, ...], tmp_path: Path) -> None:
    reference, final = uninterrupted_hang_worker(hosts, tmp_path), tmp_path / "final.pt"
    root = tmp_path / "ck"
    with job(hosts, root, final, ["--hang-rank", "1", "--hang-step", "25"], HANG_WORKER,
             ("--hang-timeout-min", "3")) as nodes:
        codes = [node.wait(timeout=300) for node in nodes]
        assert codes == [EXIT_SUCCESS, EXIT_SUCCESS], nodes[1].text()[-3000:]
        assert "a hang" in nodes[1].text(), nodes[1].text()[-3000:]
    hangs = [e for node in (0, 1) for e in read_events(RunRecord(root).events_path(node))
             if e["event"] == "hang"]
    assert any("hang_worker.py" in frame for e in hangs for frame in e["frames"]), hangs
    assert_same_weights(reference, final)


def test_a_node_that_never_starts_is_named_and_one_that_failed_before_the_other_looked_at_once(
        hosts: tuple[Host, ...], tmp_path: Path) -> None:
    root, final = tmp_path / "ck", tmp_path / "final.pt"
    port = 29500 + os.getpid() % 1000
    flags = ("--start-timeout", "15", "--rdzv-id", "missing-node")  # one run: a shared token
    started = time.monotonic()
    alone = Node(hosts[1], 1, hosts[0], root, final, port, flags=flags)
    assert alone.wait(timeout=60) == EXIT_FAILURE, alone.text()
    took = time.monotonic() - started
    assert 15 <= took < 15 + 10, f"node 1 took {took:.1f} s to give node 0 up"
    assert "waiting for node 0: no heartbeat yet" in alone.text(), alone.text()
    assert "node 0 never started" in alone.text() and "workers failed" not in alone.text()

    # Node 0 comes late in the same run: node 1's record already says it failed.
    started = time.monotonic()
    late = Node(hosts[0], 0, hosts[0], root, final, port, flags=flags)
    try:
        assert late.wait(timeout=60) == EXIT_FAILURE, late.text()
    finally:
        if late.process.poll() is None:
            late.process.kill()
    took = time.monotonic() - started
    assert took < NODE_TIMEOUT, f"node 0 took {took:.1f} s to find node 1 failed"
    assert "node 1 failed (its supervisor exited 1)" in late.text(), late.text()
    assert not list(psutil.Process().children(recursive=True)), "every process of both ended"


def test_a_worker_that_crashes_after_the_training_on_one_node_ends_the_job_as_finished(
        hosts: tuple[Host, ...], tmp_path: Path) -> None:
    reference, final = uninterrupted_hang_worker(hosts, tmp_path), tmp_path / "final.pt"
    root = tmp_path / "ck"
    started = time.monotonic()
    with job(hosts, root, final, ["--crash-at-exit-rank", "1"], HANG_WORKER) as nodes:
        # Not a restart into a rendezvous that node 0 (in torchrun's exit barrier) never joins.
        codes = [node.wait(timeout=120) for node in nodes]
        assert codes == [EXIT_SUCCESS, EXIT_SUCCESS], nodes[1].text()[-3000:]
        assert "after its training loop ended" in nodes[1].text(), nodes[1].text()[-3000:]
    took = time.monotonic() - started
    assert "failed_after_training" in history(root, 1)
    assert "restart_together" not in history(root, 1)
    assert_same_weights(reference, final)
    assert took < 90, f"the job took {took:.0f} s"


@contextlib.contextmanager
def tmpfs(path: Path) -> Iterator[Path]:
    """A tmpfs of its own at ``path``, as each host has its own /dev/shm."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_node_whose_memory_is_wiped_restarts_from_its_partners_copy_and_ends_exactly(
        hosts: tuple[Host, ...], tmp_path: Path) -> None:
    """Memory tier on two hosts, each with its own tmpfs: node 1's worker is frozen, its tmpfs
    wiped and the worker killed with SIGKILL once memory holds a checkpoint that the checkpoint
    root does not. Both nodes restart from that checkpoint, node 1 taking its files from node
    0's partner copy (verified), and the job ends bit-identical to an uninterrupted one."""
    reference = tmp_path / "reference.pt"
    with job(hosts, tmp_path / "uninterrupted", reference) as nodes:
        assert [node.wait() for node in nodes] == [EXIT_SUCCESS, EXIT_SUCCESS]

    root, final = tmp_path / "ck", tmp_path / "final.pt"
    with tmpfs(tmp_path / "shm0") as shm0, tmpfs(tmp_path / "shm1") as shm1:
        memories = [CheckpointLayout(memory_root(memory_base(shm), root)) for shm in (shm0, shm1)]
        flags = (("--memory-dir", str(shm0)), ("--memory-dir", str(shm1)))
        with job(hosts, root, final, flags=("--persist-every", "1000"),
                 node_flags=flags) as nodes:
            newest = wait_for_partner_copy(memories, nodes)
            worker = nodes[1].worker()
            worker.suspend()  # nothing more is written on node 1 from here
            durable = [name.index for name in CheckpointLayout(root).checkpoint_names()]
            shutil.rmtree(memories[1].root.parent)  # the user's base, with the memory root
            # What else the tmpfs holds is the job's state on the node (its control request,
            # beacons: $CYCLER_NODE_DIR under --memory-dir), which the live supervisor keeps.
            assert not memories[1].root.parent.exists() and not any(
                path.name.startswith("cycler-") and not path.name.endswith("-run")
                for path in shm1.iterdir())
            worker.kill()
            wait_for_text(nodes[0], "[train] resumed from")
            resumed = int(nodes[0].text().split("[train] resumed from ")[1].split()[0]
                          .rsplit("_", 1)[1])
            codes = [node.wait() for node in nodes]
            assert codes == [EXIT_SUCCESS, EXIT_SUCCESS], nodes[1].text()
        # The restart took a checkpoint the checkpoint root never had: from memory, node 1's
        # files from node 0's copy.
        assert resumed >= newest > max(durable), (resumed, newest, durable)
        assert "restart_together" in history(root, 1)
        # The job ended for good: each node's memory tier is gone, the newest checkpoint was
        # persisted (whole, by the nodes' contributions) and verifies.
        assert not memories[0].root.exists() and not memories[1].root.exists()
    assert_same_weights(reference, final)
    last = latest_checkpoint(root)
    assert last is not None
    manifest = read_manifest(last)
    assert sorted(manifest.files) == ["rank-0.pt", "rank-1.pt", "train.pt"]
    assert check_files(last, manifest, checksums=True) is None


def wait_for_partner_copy(memories: list[CheckpointLayout], nodes: list[Node]) -> int:
    """The index of a checkpoint (2 or newer) that node 0 holds with node 1's partner copy."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert all(node.process.poll() is None for node in nodes), nodes[0].text()
        for name in reversed(memories[0].checkpoint_names()):
            copy = replica_path(memories[0], name)
            if name.index >= 2 and node_files(copy) == ["rank-1.pt"]:
                return name.index
        time.sleep(0.05)
    raise AssertionError(f"no partner copy on node 0 within 120 s: {nodes[0].text()}")


def wait_for_a_checkpoint(root: Path, nodes: list[Node]) -> None:
    while latest_checkpoint(root) is None:
        assert nodes[0].process.poll() is None, nodes[0].text()
        time.sleep(0.1)


def test_a_node_that_outlives_node_0_shows_its_verdict_in_a_few_lines(
        hosts: tuple[Host, ...], tmp_path: Path) -> None:
    """Node 0 killed with SIGKILL: node 1's workers and torchrun fail on the lost peer and
    store; their tracebacks go to node 1's log file, not to its terminal, which shows one line
    for them, its own lines, and the verdict (exit 75)."""
    root, final = tmp_path / "ck", tmp_path / "final.pt"
    with job(hosts, root, final) as nodes:
        wait_for_text(nodes[0], "[train] training from step")
        wait_for_a_checkpoint(root, nodes)
        before = len(nodes[1].text().splitlines())
        nodes[0].process.kill()
        assert nodes[1].wait(timeout=60) == EXIT_REQUEUE, nodes[1].text()
        after = [line for line in nodes[1].text().splitlines()[before:]
                 if not line.startswith("[train]")]  # the worker's own prints, if any
        # The tracebacks in one line, the loss, the kill, the exit, the verdict (and a stray
        # warning of torch's, such as c10d's "hostname cannot be retrieved").
        assert len(after) <= 8, "\n".join(after)
        assert not [line for line in after if "Traceback" in line or "frame #" in line]
        assert "node 0 is gone" in nodes[1].text()
        log = root / ".cycler" / "stderr-node1.log"
        assert "Traceback" in log.read_text(), "the tracebacks are kept"
        assert sum(str(log) in line for line in after) == 1, "\n".join(after)


def test_a_node_thawed_after_the_node_timeout_exits_with_the_jobs_verdict(
        hosts: tuple[Host, ...], tmp_path: Path) -> None:
    """Node 1's ``cycle run`` frozen (SIGSTOP) past ``--node-timeout``, then thawed: node 0
    gave it up with exit 75 (a checkpoint exists), and node 1 exits 75 too, not 1. The long
    training: with the short one, node 1's workers (not frozen) finished it while node 0 was
    giving node 1 up, and node 1 rightly ended 0."""
    root, final = tmp_path / "ck", tmp_path / "final.pt"
    with job(hosts, root, final, LONG_TRAIN_ARGS) as nodes:
        wait_for_text(nodes[0], "[train] training from step")
        wait_for_a_checkpoint(root, nodes)
        nodes[1].process.send_signal(signal.SIGSTOP)  # its cycle run only: workers go on
        try:
            assert nodes[0].wait(timeout=90) == EXIT_REQUEUE, nodes[0].text()
            assert "node 1 is gone" in nodes[0].text()
        finally:
            nodes[1].process.send_signal(signal.SIGCONT)
        assert nodes[1].wait(timeout=90) == EXIT_REQUEUE, nodes[1].text()
        assert "ended the job with exit 75" in nodes[1].text()


def replays(root: Path) -> list[dict]:
    status = subprocess.run([sys.executable, "-m", "cycler_cli", "status", "--json", str(root)],
                            capture_output=True, text=True, check=True)
    return json.loads(status.stdout)["replays"]


def test_a_worker_killed_between_checkpoints_on_node_1_and_each_nodes_replayed_steps_verified(
        hosts: tuple[Host, ...], tmp_path: Path) -> None:
    # Checkpoints at steps 10 and 15; at 13 both ranks pause, node 1's is killed: torchrun
    # restarts both nodes' workers from step 10, and each node's cycle run compares its own
    # rank's replayed steps 11-13 with what the killed run recorded.
    markers = [tmp_path / f"at-13-{rank}" for rank in range(2)]
    root, final = tmp_path / "ck", tmp_path / "final.pt"
    arguments = ["--dir", str(tmp_path), "--mode", "exact"]
    with job(hosts, root, final, arguments, REPLAY_WORKER) as nodes:
        deadline = time.monotonic() + 120
        while not all(m.exists() and m.read_text() for m in markers):
            assert time.monotonic() < deadline, nodes[1].text()[-3000:]
            time.sleep(0.1)
        os.kill(int(markers[1].read_text()), signal.SIGKILL)
        assert [node.wait() for node in nodes] == [EXIT_SUCCESS, EXIT_SUCCESS], nodes[1].text()
    assert "restart_together" in history(root, 1)
    found = {replay["node"]: replay for replay in replays(root)}
    assert sorted(found) == [0, 1], found
    for replay in found.values():
        assert replay["verdict"] == "verified", replay
        assert (replay["resumed"], replay["steps"], replay["ranks"]) == (10, 3, 1), replay
    reference = tmp_path / "reference.pt"
    with job(hosts, tmp_path / "uninterrupted", reference,
             ["--dir", str(tmp_path / "none"), "--mode", "exact", "--pause-at", ""],
             REPLAY_WORKER) as nodes:
        assert [node.wait() for node in nodes] == [EXIT_SUCCESS, EXIT_SUCCESS]
    assert_same_weights(reference, final)
