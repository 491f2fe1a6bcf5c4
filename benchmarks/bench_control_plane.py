"""The control plane of N nodes on one machine: the real code, counted (issue 36).

Each simulated node is a thread driving cycle run's own ``Heartbeat`` and ``PeerWatch``
(``cycler.supervisor.nodes.peers``) and, with ``--mode store``, its ``StoreLink`` to node 0's
``TCPStore`` (``cycler.supervisor.nodes.store_link``), as the supervisor's loop does, over a real
checkpoint root in a scratch directory. Every filesystem call that names a path in the root is
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

And the commit of one checkpoint of W ranks' files (one DCP shard each): every rank lists the
checkpoint's directory and records its share (``checkpoint_files``, ``files_of_rank``,
``record_files``), rank 0 seals it and moves the link (``sealed``, ``finalize``), run one rank
after the other; calls in all and per rank.

    python benchmarks/bench_control_plane.py [--nodes 2 16 128 1024] [--mode store|files]
        [--window 10] [--node-timeout 5] [--ranks 8 64 1024 8192]

``--mode files`` is the design before issue 36 (every node reads every node's heartbeat file
each second), kept in the code as the fallback where node 0's store cannot be reached.
"""

from __future__ import annotations

import argparse
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
from cycler.checkpoint.layout import CheckpointLayout  # noqa: E402
from cycler.checkpoint.manifest import (  # noqa: E402
    checkpoint_files,
    files_of_rank,
    record_files,
    sealed,
)
from cycler.protocol.control import Action, ControlRequest, write_control  # noqa: E402
from cycler.protocol.names import LIVENESS_STORE_FILENAME  # noqa: E402
from cycler.protocol.record import RunRecord
from cycler.supervisor.nodes.peers import BEAT_SECONDS, Heartbeat, PeerWatch  # noqa: E402
from cycler.supervisor.nodes.store_link import StoreLink  # noqa: E402
from cycler.supervisor.shell import stops_elsewhere  # noqa: E402

LOOP_SECONDS = 0.2
"""How often a simulated supervisor beats and looks (its real loop ticks every 0.1 s; both
are throttled to once a second inside)."""


class Counter:
    """Filesystem calls naming a path under ``root``, by kind."""

    def __init__(self) -> None:
        self.root = ""
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, kind: str, path: Any) -> None:
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


class SimNode:
    """One supervisor's control plane: beats, watches, and notes when it learns of a loss."""

    def __init__(self, run_record: RunRecord, node: int, nnodes: int, timeout: float,
                 store: bool) -> None:
        self.node = node
        self.link = StoreLink(run_record.directory / LIVENESS_STORE_FILENAME, node, nnodes,
                              "127.0.0.1", BEAT_SECONDS) if store else None
        self.heartbeat = Heartbeat(run_record, node, "bench", self.link)
        self.peers = PeerWatch(run_record, node, nnodes, timeout=timeout, run="bench",
                               start_timeout=3600.0, link=self.link)
        self.lost: tuple[int, float] | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            self.heartbeat.beat(now)
            loss = self.peers.lost(now, stepping=True)
            if loss is not None and self.lost is None:
                self.lost = (loss.node, now)
            self._stop.wait(LOOP_SECONDS)

    def up(self) -> bool:
        return self.link is None or self.link.connected

    def kill(self) -> None:
        """As SIGKILL would: no more beats, no exit code; node 0's store goes with it."""
        self._stop.set()
        self.thread.join()
        if self.link is not None:
            self.link.close()
            self.link._thread.join(10)
            self.link._store = None
            gc.collect()


def _all_seen(nodes: list[SimNode]) -> bool:
    seen = nodes[0].peers._seen
    return all(n.up() for n in nodes) and all(
        node in seen and seen[node].alive for node in range(1, len(nodes)))


def run_nodes(nnodes: int, store: bool, window: float, timeout: float,
              kill: int | None, stopper: int) -> dict[str, Any]:
    """One simulated job: the load once every node is up, then the time to find ``kill``
    gone on every live node (``None``: no kill)."""
    with tempfile.TemporaryDirectory(dir=".") as scratch:
        root = Path(scratch) / "root"
        run_record = RunRecord(root)
        run_record.directory.mkdir(parents=True)
        COUNTER.root = str(run_record.root)
        nodes = [SimNode(run_record, node, nnodes, timeout, store) for node in range(nnodes)]
        started = time.monotonic()
        while not _all_seen(nodes):
            if time.monotonic() - started > 300:
                raise SystemExit(f"{nnodes} nodes: not all up after 300 s")
            time.sleep(0.2)
        up_after = time.monotonic() - started
        time.sleep(2 * BEAT_SECONDS)  # the files written before the store was reached
        COUNTER.reset()
        time.sleep(window)
        calls = COUNTER.total()
        kinds = dict(COUNTER.calls)
        result: dict[str, Any] = {"nodes": nnodes, "mode": "store" if store else "files",
                                  "up_s": round(up_after, 1), "calls_per_s": calls / window,
                                  "per_node_per_s": calls / window / nnodes, "kinds": kinds}
        if store:
            result["stopper"] = stopper
            result["stop_everywhere_s"] = stop_reach(nodes, stopper)
        stop_calls = stop_relay_calls(run_record, nnodes, nodes[0].link)
        result["exit_reads_per_node"] = stop_calls
        if kill is not None:
            victim = nodes[kill]
            killed_at = time.monotonic()  # its beats stop now: its threads are joined after
            victim.kill()
            live = [n for n in nodes if n is not victim]
            give_up = killed_at + 3 * timeout + 30
            while any(n.lost is None for n in live) and time.monotonic() < give_up:
                time.sleep(0.05)
            found = [n.lost for n in live]
            result["killed"] = kill
            result["found_s"] = None if None in found else round(
                max(at for _, at in found) - killed_at, 2)
            result["named"] = sorted({node for node, _ in found if node is not None}) \
                if None not in found else None
        for node in nodes:
            node.kill()
        return result


def stop_reach(nodes: list[SimNode], stopper: int) -> float | None:
    """Seconds from a stop said on node ``stopper`` until every node's link read it."""
    request = ControlRequest(sequence=1, action=Action.CHECKPOINT_AND_EXIT, reason="SIGTERM",
                             requested_at=time.time(), deadline=None)
    said_at = time.monotonic()
    assert nodes[stopper].link is not None
    nodes[stopper].link.say_stop(request.to_json())
    while any(not (n.link and n.link.stops()) for n in nodes):
        if time.monotonic() - said_at > 60:
            return None
        time.sleep(0.01)
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
    assert link is not None or stops_elsewhere(run_record, 0, since=0.0, link=link)
    if link is not None:
        stops_elsewhere(run_record, 0, since=0.0, link=link)
    return COUNTER.total()


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
        records = {}
        per_rank = []
        for rank in range(ranks):
            before = COUNTER.total()
            names = checkpoint_files(directory)
            records.update(record_files(directory, files_of_rank(names, rank, ranks)))
            per_rank.append(COUNTER.total() - before)
        before = COUNTER.total()
        manifest = sealed(directory, index=0, world_size=ranks, records=records)
        finalize(layout, name, manifest)
        rank0 = COUNTER.total() - before
        seconds = time.perf_counter() - started
        return {"ranks": ranks, "calls": COUNTER.total(),
                "per_rank": statistics.median(per_rank), "rank0_seal": rank0,
                "seconds": round(seconds, 2), "kinds": dict(COUNTER.calls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 16, 128, 1024])
    parser.add_argument("--mode", choices=("store", "files"), default="store")
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--node-timeout", type=float, default=5.0)
    parser.add_argument("--ranks", type=int, nargs="*", default=[8, 64, 1024, 8192])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    install_counter()
    rng = random.Random(args.seed)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"# commit {commit}, load {os.getloadavg()[0]:.1f}, mode {args.mode}, "
          f"node timeout {args.node_timeout:g} s")
    for nnodes in args.nodes:
        for victim in (rng.randrange(1, nnodes), 0):
            result = run_nodes(nnodes, args.mode == "store", args.window, args.node_timeout,
                               victim, rng.randrange(nnodes))
            print(json.dumps(result), flush=True)
    for ranks in args.ranks:
        print(json.dumps(commit_calls(ranks)), flush=True)


if __name__ == "__main__":
    main()
