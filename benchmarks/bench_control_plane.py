"""The control plane of N nodes on one machine: the real code, counted (issue 36).

Each simulated node is cycle run's own ``Heartbeat`` and ``PeerWatch``
(``cycler.supervisor.nodes.peers``) and, with ``--mode store``, its ``StoreLink`` to node 0's
``TCPStore`` (``cycler.supervisor.nodes.store_link``), over a real checkpoint root in a scratch
directory, driven by a few threads for all nodes (:class:`Drivers`: one runs every node's loop,
``--links`` beat the links; 1,024 nodes with threads of their own overloaded the machine).
Every filesystem call that names a path in the root is
counted (an audit hook for opens, renames, removals, listings; wrappers for ``stat``, ``lstat``,
``readlink``). Per N it prints:

- the calls on the root per second, per node and in all, once every node is up (``--window``);
- the time until every live node knows a killed node k (random, not 0) is gone, and then the
  same for node 0 (its store goes with it), against ``--node-timeout``;
- the time for a stop said on a random node (``StoreLink.say_stop``, as the supervisor that
  gets the signal does) to be read on every node (its link's ``stops``);
- the calls one node makes on the root at its workers' exit to learn whether another node
  asked for the stop (``stops_elsewhere``: a fresh read of the store; every other node's
  control file with ``--mode files``).

And the commit of one checkpoint of W ranks' files (one DCP shard each): rank 0 lists the
checkpoint's directory once and plans who records what (``commit_plan``), every rank records
its share (``share_of_plan``, ``record_files``), rank 0 seals it and moves the link
(``sealed``, ``finalize``), run one rank after the other; calls in all and per rank.

    python benchmarks/bench_control_plane.py [--nodes 2 16 128 1024] [--mode store|files]
        [--window 10] [--node-timeout 5] [--ranks 8 64 1024 8192] [--netns] [--max-load 12]

``--mode files`` is the design before issue 36 (every node reads every node's heartbeat file
each second), kept in the code as the fallback where node 0's store cannot be reached.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# A client of a store that is gone (node 0 killed) logs a C++ traceback at every try.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")

from cycler.checkpoint.commit import finalize  # noqa: E402  # noqa: E402
from cycler.checkpoint.coordination import Coordinator  # noqa: E402
from cycler.checkpoint.layout import CheckpointLayout  # noqa: E402
from cycler.checkpoint.manifest import (  # noqa: E402
    checkpoint_files,
    commit_plan,
    files_of_rank,
    record_files,
    sealed,
    share_of_plan,
)
from cycler.protocol.control import Action, ControlRequest, write_control  # noqa: E402
from cycler.protocol.names import LIVENESS_STORE_FILENAME  # noqa: E402
from cycler.protocol.record import RunRecord
from cycler.supervisor.nodes.peers import BEAT_SECONDS, Heartbeat, PeerWatch  # noqa: E402
from cycler.supervisor.nodes.root_io import RootIO  # noqa: E402
from cycler.supervisor.nodes.store_link import LINK_SECONDS, StoreLink  # noqa: E402
from cycler.supervisor.shell import stops_elsewhere  # noqa: E402

LOOP_SECONDS = 0.2
"""How often a simulated supervisor beats and looks (its real loop ticks every 0.1 s; both
are throttled to once a second inside)."""


class Counter:
    """Filesystem calls naming a path under ``root``, by kind."""

    def __init__(self) -> None:
        self.root = ""
        self.thread: int | None = None
        """Where set, only this thread's calls count (one node's, among the others')."""
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, kind: str, path: Any) -> None:
        if self.thread is not None and threading.get_ident() != self.thread:
            return
        if self.root and isinstance(path, str | bytes | os.PathLike):
            text = os.fsdecode(path)
            if text.startswith(self.root):
                with self._lock:
                    self.calls[kind] = self.calls.get(kind, 0) + 1

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def reset(self) -> None:
        with self._lock:
            self.calls = {}


COUNTER = Counter()
AUDITED = {"open", "os.rename", "os.remove", "os.mkdir", "os.listdir", "os.scandir",
           "os.symlink", "os.link", "os.utime", "os.chmod", "os.truncate"}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in AUDITED and args:
        COUNTER.count(event, args[0])


def _wrapped(name: str) -> None:
    original: Callable[..., Any] = getattr(os, name)

    def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTER.count(f"os.{name}", path)
        return original(path, *args, **kwargs)

    setattr(os, name, counted)


def install_counter() -> None:
    sys.addaudithook(_audit)
    for name in ("stat", "lstat", "readlink"):
        _wrapped(name)


class NodeIO:
    """One node's calls on the root, run off its loop as the supervisor's ``RootIO`` runs
    them, in a ``RootIO`` thread the simulated nodes share, under names of the node's own."""

    def __init__(self, shared: RootIO, node: int) -> None:
        self._shared, self._node = shared, node

    def submit(self, name: str, call: Callable[[], object]) -> None:
        self._shared.submit(f"{self._node}/{name}", call)

    def busy(self, name: str) -> bool:
        return self._shared.busy(f"{self._node}/{name}")


class SimNode:
    """One supervisor's control plane: its beats, its watch, and when it learns of a loss.
    Its link has no thread of its own: the :class:`Drivers` step it."""

    def __init__(self, run_record: RunRecord, node: int, nnodes: int, timeout: float,
                 store: bool, root_io: RootIO) -> None:
        self.node = node
        self.link = StoreLink(run_record.directory / LIVENESS_STORE_FILENAME, node, nnodes,
                              "127.0.0.1", LINK_SECONDS, start=False) if store else None
        self.heartbeat = Heartbeat(run_record, node, "bench", self.link,
                                   root_io=NodeIO(root_io, node))  # type: ignore[arg-type]
        self.peers = PeerWatch(run_record, node, nnodes, timeout=timeout, run="bench",
                               start_timeout=3600.0, link=self.link)
        self.lost: tuple[int, float] | None = None
        self.alive = True
        self.stepping = threading.Lock()
        """Held while its link beats: a kill waits for the beat under way, as SIGKILL would
        land between two."""
        self.due = time.monotonic() + random.uniform(0.0, LINK_SECONDS)
        """When its link beats next: the nodes start at random moments of a period, as
        nodes started by hand or by Slurm do (in phase, a stop would reach all at once)."""

    def tick(self, now: float) -> None:
        """One turn of the supervisor's loop: beat, look."""
        self.heartbeat.beat(now)
        loss = self.peers.lost(now, stepping=True)
        if loss is not None and self.lost is None:
            self.lost = (loss.node, now)

    def step_link(self, now: float) -> bool:
        """Beat its link if due (a period after its last beat ended, or at once where it was
        asked to: a stop said); whether it beat."""
        link = self.link
        if link is None or now < self.due and not link._wake.is_set():
            return False
        with self.stepping:
            if self.alive:
                link._wake.clear()
                link.step()
        self.due = time.monotonic() + link._period
        return True

    def up(self) -> bool:
        return self.link is None or self.link.connected

    def kill(self) -> None:
        """As SIGKILL would: no more beats, no exit code; node 0's store goes with it."""
        self.alive = False
        if self.link is not None:
            with self.stepping:
                self.link.close()
                self.link._store = None  # node 0: the TCPStore server is freed, its port shut
            if self.node == 0:
                gc.collect()


class Drivers:
    """The threads that run every simulated node's real objects in turn: one steps every
    supervisor's loop each :data:`LOOP_SECONDS`; ``links`` threads each beat a share of the
    links when due. A thread per node and a thread per link (2,048 at 1,024 nodes, as each
    ``cycle run`` has) drove the shared 2-core machine to load 300; a supervisor's loop never
    blocks, and a link's beat blocks only on the store, so a few threads keep every node to
    its period while they keep up (``lag``: how late the beats came, measured)."""

    def __init__(self, nodes: list[SimNode], links: int) -> None:
        self.nodes = nodes
        self.stopped = threading.Event()
        self.wake = [threading.Event() for _ in range(links)]
        self.lag = [0.0] * (links + 1)
        self.threads = [threading.Thread(target=self._loops, daemon=True)]
        self.threads += [threading.Thread(target=self._links, args=(k, nodes[k::links]),
                                          daemon=True) for k in range(links)]
        for thread in self.threads:
            thread.start()

    def _loops(self) -> None:
        while not self.stopped.is_set():
            began = time.monotonic()
            for node in self.nodes:
                if node.alive:
                    node.tick(time.monotonic())
            spent = time.monotonic() - began
            self.lag[-1] = max(self.lag[-1], spent - LOOP_SECONDS)
            self.stopped.wait(max(0.0, LOOP_SECONDS - spent))

    def _links(self, k: int, share: list[SimNode]) -> None:
        while not self.stopped.is_set():
            for node in share:
                if self.stopped.is_set():
                    return
                if node.alive:
                    due = node.due
                    if node.step_link(time.monotonic()):
                        self.lag[k] = max(self.lag[k], time.monotonic() - due)
            self.wake[k].wait(0.05)
            self.wake[k].clear()

    def rouse(self, node: SimNode) -> None:
        """A stop was said on ``node``: its link beats now (its own thread would wake)."""
        self.wake[self.nodes.index(node) % (len(self.threads) - 1)].set()

    def reset_lag(self) -> None:
        self.lag = [0.0] * len(self.lag)

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()


def _all_seen(nodes: list[SimNode]) -> bool:
    seen = nodes[0].peers._seen
    return all(n.up() for n in nodes) and all(
        node in seen and seen[node].alive for node in range(1, len(nodes)))


def run_nodes(nnodes: int, store: bool, window: float, timeout: float,
              kill: int | None, stopper: int, links: int = 8) -> dict[str, Any]:
    """One simulated job: the load once every node is up, then the time to find ``kill``
    gone on every live node (``None``: no kill)."""
    with tempfile.TemporaryDirectory(dir=".") as scratch:
        root = Path(scratch) / "root"
        run_record = RunRecord(root)
        run_record.directory.mkdir(parents=True)
        COUNTER.root = str(run_record.root)
        root_io = RootIO()
        nodes = [SimNode(run_record, node, nnodes, timeout, store, root_io)
                 for node in range(nnodes)]
        drivers = Drivers(nodes, min(links, nnodes))
        try:
            return _measured(nodes, drivers, run_record, store, window, kill, stopper,
                             timeout)
        finally:
            drivers.stop()
            for node in nodes:
                node.kill()
            root_io.close()


def _measured(nodes: list[SimNode], drivers: Drivers, run_record: RunRecord, store: bool,
              window: float, kill: int | None, stopper: int,
              timeout: float) -> dict[str, Any]:
    nnodes = len(nodes)
    started = time.monotonic()
    while not _all_seen(nodes):
        if time.monotonic() - started > 300:
            raise SystemExit(f"{nnodes} nodes: not all up after 300 s")
        guard_load()
        time.sleep(0.2)
    up_after = time.monotonic() - started
    print(f"# {nnodes} nodes up after {up_after:.1f} s, load {os.getloadavg()[0]:.1f}",
          file=sys.stderr, flush=True)
    time.sleep(2 * BEAT_SECONDS)  # the files written before the store was reached
    COUNTER.reset()
    drivers.reset_lag()
    time.sleep(window)
    calls = COUNTER.total()
    kinds = dict(COUNTER.calls)
    result: dict[str, Any] = {"nodes": nnodes, "mode": "store" if store else "files",
                              "up_s": round(up_after, 1), "calls_per_s": calls / window,
                              "per_node_per_s": calls / window / nnodes, "kinds": kinds,
                              "link_lag_s": round(max(drivers.lag[:-1]), 2),
                              "loop_lag_s": round(drivers.lag[-1], 2),
                              "load": round(os.getloadavg()[0], 1)}
    if store:
        result["stopper"] = stopper
        result["stop_everywhere_s"] = stop_reach(nodes, drivers, stopper)
    stop_calls = stop_relay_calls(run_record, nnodes, nodes[0].link)
    result["exit_reads_per_node"] = stop_calls
    if kill is not None:
        result.update(found_gone(nodes, kill, timeout))
    return result


def found_gone(nodes: list[SimNode], kill: int, timeout: float) -> dict[str, Any]:
    """Kill node ``kill``; how long until every live node knows it is gone, and whom they
    named."""
    victim = nodes[kill]
    killed_at = time.monotonic()  # its beats stop now
    victim.kill()
    live = [n for n in nodes if n is not victim]
    give_up = killed_at + 3 * timeout + 30
    while any(n.lost is None for n in live) and time.monotonic() < give_up:
        guard_load()
        time.sleep(0.05)
    found = [n.lost for n in live]
    return {"killed": kill,
            "found_s": None if None in found else round(
                max(at for _, at in found if at) - killed_at, 2),  # type: ignore[misc]
            "named": sorted({n for n, _ in found if n is not None})  # type: ignore[misc]
            if None not in found else None}


LIMITS = {"load": 0.0}
"""The 1-minute load average above which the run stops (``--max-load``; 0: never): on a
shared machine others' tests are sensitive to its load."""


def guard_load() -> None:
    load = os.getloadavg()[0]
    if LIMITS["load"] and load > LIMITS["load"]:
        raise SystemExit(f"stopped: load {load:.1f} > --max-load {LIMITS['load']:g}")


def stop_reach(nodes: list[SimNode], drivers: Drivers, stopper: int) -> float | None:
    """Seconds from a stop said on node ``stopper`` until every node's link read it."""
    request = ControlRequest(sequence=1, action=Action.CHECKPOINT_AND_EXIT, reason="SIGTERM",
                             requested_at=time.time(), deadline=None)
    said_at = time.monotonic()
    link = nodes[stopper].link
    assert link is not None
    link.say_stop(request.to_json())
    drivers.rouse(nodes[stopper])
    waiting = list(nodes)
    while waiting:
        if time.monotonic() - said_at > 60:
            return None
        waiting = [n for n in waiting if not (n.link and n.link.stops())]
        time.sleep(0.02)
    return round(time.monotonic() - said_at, 2)


def stop_relay_calls(run_record: RunRecord, nnodes: int, link: StoreLink | None) -> int:
    """What node 0's supervisor reads on the root when its workers exit, to learn whether
    another node asked for the stop: a fresh read of the store (no file), or every other
    node's control file where there is no store."""
    request = ControlRequest(sequence=1, action=Action.CHECKPOINT_AND_EXIT, reason="SIGTERM",
                             requested_at=time.time(), deadline=None)
    for node in range(nnodes):
        write_control(run_record.control_path(node), request)
    COUNTER.reset()
    COUNTER.thread = threading.get_ident()  # the other nodes' beats go on meanwhile
    try:
        assert link is not None or stops_elsewhere(run_record, 0, since=0.0, link=link)
        if link is not None:
            stops_elsewhere(run_record, 0, since=0.0, link=link)
        return COUNTER.total()
    finally:
        COUNTER.thread = None


def commit_calls(ranks: int) -> dict[str, Any]:
    """The calls of one commit of ``ranks`` ranks' files, every rank's share done in turn."""
    with tempfile.TemporaryDirectory(dir=".") as scratch:
        root = Path(scratch) / "root"
        layout = CheckpointLayout(root)
        name = layout.parse(f"{layout.prefix}_checkpoint_0")
        assert name is not None
        directory = layout.path_of(name)
        directory.mkdir(parents=True)
        for rank in range(ranks):
            (directory / f"__{rank}_0.distcp").write_bytes(b"x" * 1024)
        COUNTER.root = str(layout.root)
        COUNTER.reset()
        started = time.perf_counter()
        plan = json.dumps(commit_plan(checkpoint_files(directory), ranks))  # rank 0, once
        planned = COUNTER.total()
        records = {}
        per_rank = []
        for rank in range(ranks):  # each rank, from the plan it read in the store
            before = COUNTER.total()
            share = share_of_plan(json.loads(plan), rank, ranks)
            records.update(record_files(directory, share))
            per_rank.append(COUNTER.total() - before)
        before = COUNTER.total()
        manifest = sealed(directory, index=0, world_size=ranks, records=records)
        finalize(layout, name, manifest)
        rank0 = COUNTER.total() - before
        seconds = time.perf_counter() - started
        listed = time.perf_counter()  # what each rank did before the plan: list, pick its own
        files_of_rank(checkpoint_files(directory), ranks - 1, ranks)
        listed = time.perf_counter() - listed
        return {"ranks": ranks, "calls": COUNTER.total(), "rank0_plan": planned,
                "per_rank": statistics.median(per_rank), "rank0_seal": rank0,
                "seconds": round(seconds, 2), "kinds": dict(COUNTER.calls),
                "names_read": 2 * ranks, "names_read_before": ranks * ranks + ranks,
                "barrier_store_lookups": barrier_lookups(ranks),
                "barrier_store_lookups_before": ranks * ranks + ranks,
                "one_rank_listing_before_s": round(listed, 4)}


class KeyCounter:
    """A store that counts the keys each call names and never blocks: the ranks' calls of a
    barrier driven one rank after the other are the calls each makes, whatever their order."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.lookups = 0

    def add(self, key: str, amount: int) -> int:
        self.lookups += 1
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]

    def set(self, key: str, value: str) -> None:
        self.lookups += 1
        self.values[key] = 0

    def wait(self, keys: list[str], timeout: Any) -> None:
        self.lookups += len(keys)

    def delete_key(self, key: str) -> bool:
        self.lookups += 1
        return self.values.pop(key, None) is not None


def barrier_lookups(ranks: int) -> int:
    """The store keys named by one commit's barrier (``Coordinator.wait_for_all`` after each
    rank's ``arrive``) on ``ranks`` ranks, every rank's calls counted."""
    store = KeyCounter()
    for rank in range(ranks):
        coordinator = Coordinator("bench", datetime.timedelta(seconds=1))
        coordinator._bound = (rank, ranks, store)
        coordinator.arrive("round/1", "done")
        coordinator.wait_for_all("round/1")
    return store.lookups


def own_network() -> None:
    """Run again in a network namespace of its own, with only its loopback: torch's
    ``TCPStore`` looks up the name of every address it connects from and to, and where the
    machine's DNS server drops one query in a few dozen (this sandbox's does) each such
    connection stalls 5 s, and node 0's store with it; there the lookups fail at once."""
    if os.environ.get("CYCLER_BENCH_NETNS") == "1":
        return
    os.environ["CYCLER_BENCH_NETNS"] = "1"
    command = 'ip link set lo up && exec "$0" "$@"'
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", command, sys.executable, *sys.argv])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[2, 16, 128, 1024])
    parser.add_argument("--mode", choices=("store", "files"), default="store")
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--node-timeout", type=float, default=5.0)
    parser.add_argument("--ranks", type=int, nargs="*", default=[8, 64, 1024, 8192])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--links", type=int, default=8,
                        help="threads that beat the nodes' store links, each a share")
    parser.add_argument("--max-load", type=float, default=LIMITS["load"],
                        help="stop where the 1-minute load average goes above this "
                             "(0, the default: never)")
    parser.add_argument("--netns", action="store_true",
                        help="run in a network namespace of its own (root): see own_network")
    args = parser.parse_args()
    if args.netns:
        own_network()
    LIMITS["load"] = args.max_load
    install_counter()
    rng = random.Random(args.seed)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"# commit {commit}, load {os.getloadavg()[0]:.1f}, mode {args.mode}, "
          f"node timeout {args.node_timeout:g} s")
    for nnodes in args.nodes:
        for victim in (rng.randrange(1, nnodes), 0):
            result = run_nodes(nnodes, args.mode == "store", args.window, args.node_timeout,
                               victim, rng.randrange(nnodes), args.links)
            print(json.dumps(result), flush=True)
    for ranks in args.ranks:
        print(json.dumps(commit_calls(ranks)), flush=True)


if __name__ == "__main__":
    main()
