"""The nodes' liveness over TCP: node 0's supervisor hosts a store (torch's own ``TCPStore``);
every supervisor puts its heartbeat record there, and reads back only what it must watch.

On a shared filesystem every node reading every other node's heartbeat file each second is
N(N-1) file opens a second on the metadata server (a million at 1,024 nodes), and a filesystem
that stalls for a minute makes every node take the others for dead. Through the store, each
node makes one ``set`` and one ``multi_get`` a second and touches no file: node 0 reads every
node's record (N values in one request) and names the first one gone under a verdict key; every
other node reads node 0's record and the verdict. So a node k that is gone is found by node 0
and the verdict reaches every node within a second, and node 0 gone is found by every node:
its store stops answering (its records stop changing, or the connection is refused).

Where the store cannot be reached (node 0 not started yet, or gone), the caller falls back to
the heartbeat files in the checkpoint root (:mod:`.peers`): node 0's, which says how it ended.
The store's address, with a token of this start of node 0, is in ``.cycler/`` of the root: the
only file the other nodes read, once, to connect.

Stop requests travel the same way: the supervisor that is asked to stop appends the request
to one key (``stops``) at once, and every node reads that key at each beat with the records it
reads anyway, so a stop from any node is known on every node within a beat, and a supervisor
whose workers exit learns whether another node asked for the stop without reading the other
nodes' control files (it reads them only while the store cannot be reached).

Every call to the store runs in this module's thread, with a short timeout: a store that does
not answer never holds up the supervisor's loop.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from cycler._fs import atomic_write_bytes, read_json_object

log = logging.getLogger(__name__)

LINK_SECONDS = 0.5
"""How often the link beats and reads: what it read is at most this old."""
STORE_TIMEOUT_SECONDS = 2.0
"""How long one call to the store may take before the store counts as unreachable."""
STALE_SECONDS = STORE_TIMEOUT_SECONDS + 4 * LINK_SECONDS
"""A read older than this is not used (a beat takes a period and at most a store timeout)."""
VERDICT = "lost"
"""The key under which node 0 names the first node found gone (``{}``: none)."""
STOPS = "stops"
"""The key every node appends its stop requests to, one JSON line each."""


class StoreLink:
    """This node's line to the job's liveness store; a thread beats and reads every
    ``period`` seconds. :meth:`records` is what it read last (``None``: unreachable)."""

    def __init__(self, address_path: Path, node_rank: int, nnodes: int, host: str,
                 period: float) -> None:
        self._address_path = address_path
        self._node, self._nnodes, self._host, self._period = node_rank, nnodes, host, period
        self._lock = threading.Lock()
        self._record = "{}"
        self._records: dict[int, dict[str, Any]] | None = None
        self._verdict: str | None = None
        self._stops_out: list[str] = []
        self._stops: list[dict[str, Any]] | None = None
        self._begun = self._beats = 0
        self._read_at = float("-inf")
        self._beaten = threading.Condition(self._lock)
        self._store: Any = None
        self._prefix = ""
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cycle-liveness", daemon=True)
        self._thread.start()

    def publish(self, record: dict[str, Any]) -> None:
        """This node's record, sent at the next beat."""
        with self._lock:
            self._record = json.dumps(record)

    def send_now(self, record: dict[str, Any]) -> None:
        """Send this node's record at once (its end: the process exits next); best effort."""
        self.publish(record)
        store = self._store
        if store is not None:
            with contextlib.suppress(Exception):
                store.set(self._key(self._node), self._record)

    def say_lost(self, verdict: dict[str, Any]) -> None:
        """Node 0: tell every node which node is gone (sent at the next beat)."""
        with self._lock:
            self._verdict = json.dumps(verdict)

    def say_stop(self, request: str) -> None:
        """Append this node's stop request (a control request's JSON) for every node to
        read: sent at once, and again at each beat until the store took it."""
        with self._lock:
            self._stops_out.append(json.dumps({"node": self._node, "request": request}))
        self._wake.set()

    def stops(self) -> list[dict[str, Any]] | None:
        """Every node's stop requests (``{"node": k, "request": json}``) read at the last beat;
        ``None`` while the store cannot be reached."""
        with self._lock:
            return None if self._stale() else self._stops

    def stops_now(self, wait: float = 2 * STORE_TIMEOUT_SECONDS) -> list[dict[str, Any]] | None:
        """:meth:`stops` as read by a beat that begins after this call (waits up to ``wait``
        seconds for it; ``None``: the store did not answer). Call it off the supervisor's
        loop: it blocks."""
        with self._beaten:
            target = self._begun + 1  # the beat under way may have read before this call
            self._wake.set()
            self._beaten.wait_for(lambda: self._beats >= target or self._closed.is_set(), wait)
            return self._stops if self._beats >= target else None

    def records(self) -> dict[int, dict[str, Any]] | None:
        """The records read last: every other node's on node 0, node 0's and the verdict
        (under ``-1``) elsewhere; ``None`` while the store cannot be reached, and where the
        last read is older than :data:`STALE_SECONDS` (this process was frozen, or starved:
        what it read then says nothing of now, and the caller reads the files)."""
        with self._lock:
            return None if self._stale() else self._records

    @property
    def connected(self) -> bool:
        """Whether the last beat reached the store."""
        return self.records() is not None

    def _stale(self) -> bool:
        return time.monotonic() - self._read_at > STALE_SECONDS

    def close(self) -> None:
        self._closed.set()
        self._wake.set()

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                self._begun += 1
            try:
                if self._store is None:
                    self._store = self._connect()
                if self._store is not None:
                    self._beat(self._store)
            except Exception as error:  # noqa: BLE001 (any failure of the store: unreachable)
                log.debug("liveness store: %s", error)
                with self._lock:
                    self._records = self._stops = None
                if self._node != 0:
                    self._store = None  # connect again, through the address file
            with self._beaten:
                self._beats += 1
                self._beaten.notify_all()
            self._wake.wait(self._period)
            self._wake.clear()

    def _beat(self, store: Any) -> None:
        with self._lock:
            record, verdict, stops = self._record, self._verdict, list(self._stops_out)
        for stop in stops:
            store.append(self._key(STOPS), stop + "\n")
            with self._lock:
                self._stops_out.remove(stop)
        store.set(self._key(self._node), record)
        if self._node == 0:
            if verdict is not None:
                store.set(self._key(VERDICT), verdict)
            nodes = list(range(1, self._nnodes))
        else:
            nodes = [0, -1]
        values = store.multi_get([*(self._key(VERDICT if n == -1 else n) for n in nodes),
                                  self._key(STOPS)])
        found = {node: _parsed(value) for node, value in zip(nodes, values, strict=False)}
        with self._lock:
            self._records, self._read_at = found, time.monotonic()
            self._stops = [_parsed(line) for line in values[-1].splitlines() if line.strip()]

    def _connect(self) -> Any:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=STORE_TIMEOUT_SECONDS)
        if self._node == 0:
            store = dist.TCPStore(self._host, 0, is_master=True, wait_for_workers=False,
                                  timeout=timeout)
            fresh = uuid.uuid4().hex
            self._prefix = f"cycler/{fresh}/"
            # Every key exists before anyone reads: a get never waits for a missing one.
            for key in [*range(self._nnodes), VERDICT]:
                store.set(self._key(key), "{}")
            store.set(self._key(STOPS), "")
            address = {"host": self._host, "port": store.port, "token": fresh,
                       "pid": os.getpid()}
            atomic_write_bytes(self._address_path, json.dumps(address).encode(),
                               durable=False)
            return store
        found = read_json_object(self._address_path)
        port, token = found.get("port"), found.get("token")
        if not isinstance(port, int) or not isinstance(token, str):
            return None
        store = dist.TCPStore(str(found.get("host")), port, is_master=False,
                              wait_for_workers=False, timeout=timeout)
        self._prefix = f"cycler/{token}/"
        store.get(self._key(VERDICT))  # the token's keys exist: node 0 of this address
        return store

    def _key(self, node: int | str) -> str:
        return f"{self._prefix}{node}"


def _parsed(value: bytes) -> dict[str, Any]:
    try:
        found = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return {}
    return found if isinstance(found, dict) else {}
