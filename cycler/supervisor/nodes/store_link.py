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

Anyone who can reach node 0's port can read and write the store (torch's ``TCPStore`` has no
authentication; ``list_keys`` even shows the token). So every value this job writes is sealed
with a secret that only the job's user can read (:func:`seal`: an HMAC of the key and the value,
the secret in the address file, mode 0600 in the user's own root), and a value whose seal does
not hold is read as absent: a stranger who writes a verdict, a record or a stop request is
ignored (said once per key, with the port to close), and one who erases or garbles a value only
makes this node read it again at the next beat (each node writes its record, node 0 its verdict,
every beat; a node whose stop request is gone from the store appends it again).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from cycler._fs import atomic_write, read_json_object
from cycler._private import PRIVATE_FILE_MODE

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


def seal(secret: bytes, key: str, value: str) -> str:
    """``value`` as stored under ``key``: with an HMAC-SHA256 of both under ``secret``, so
    that a value moved to another key, or from another start of node 0, does not hold."""
    mac = hmac.new(secret, f"{key}\0{value}".encode(), hashlib.sha256).hexdigest()
    return json.dumps({"value": value, "mac": mac})


def unseal(secret: bytes, key: str, stored: bytes | str) -> str | None:
    """The value :func:`seal` stored under ``key``, or ``None`` where its seal does not hold
    (written by someone without the secret, garbled, or empty)."""
    try:
        found = json.loads(stored)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("value"), str) \
            or not isinstance(found.get("mac"), str):
        return None
    value = found["value"]
    expected = hmac.new(secret, f"{key}\0{value}".encode(), hashlib.sha256).hexdigest()
    return value if hmac.compare_digest(expected, found["mac"]) else None


class StoreLink:
    """This node's line to the job's liveness store; a thread beats and reads every
    ``period`` seconds. :meth:`records` is what it read last (``None``: unreachable)."""

    def __init__(self, address_path: Path, node_rank: int, nnodes: int, host: str,
                 period: float, start: bool = True) -> None:
        self._address_path = address_path
        self._node, self._nnodes, self._host, self._period = node_rank, nnodes, host, period
        self._lock = threading.Lock()
        self._record = "{}"
        self._records: dict[int, dict[str, Any]] | None = None
        self._verdict: str | None = None
        self._stops_out: list[str] = []
        self._stops_sent: list[str] = []
        """This node's stop requests the store took: appended again if they go missing."""
        self._forged: set[int | str] = set()
        """The keys where a value without this job's seal was found (each said once)."""
        self._secret = b""
        self._stops: list[dict[str, Any]] | None = None
        self._begun = self._beats = 0
        self._read_at = float("-inf")
        self._beaten = threading.Condition(self._lock)
        self._store: Any = None
        self._prefix = ""
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cycle-liveness", daemon=True)
        if start:  # else the caller beats with step() (a simulation of many nodes)
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
                store.set(self._key(self._node), self._sealed(self._node, self._record))

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

    def hand_over_verdict(self) -> None:
        """Node 0 at its end, after it named a node gone: keep the store up until a beat has
        put the verdict there and the other nodes' beats (every ``period``) have read it, at
        most about a store timeout and two periods. Else a third node, whose own torchrun
        fails only once node 0's rendezvous store is gone, learns the end seconds later."""
        with self._beaten:
            target = self._begun + 1
            self._wake.set()
            self._beaten.wait_for(lambda: self._beats >= target or self._closed.is_set(),
                                  STORE_TIMEOUT_SECONDS)
        self._closed.wait(2 * self._period)

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
            self.step()
            self._wake.wait(self._period)
            self._wake.clear()

    def step(self) -> None:
        """One beat, as the link's thread makes every ``period`` seconds: connect where not
        connected, send this node's record and stops, read what it watches. Blocks up to the
        store's timeout (twice where it connects): for a caller that drives many nodes' links
        from a few threads (``start=False``), never from the supervisor's loop."""
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

    def _beat(self, store: Any) -> None:
        with self._lock:
            record, verdict, stops = self._record, self._verdict, list(self._stops_out)
        for stop in stops:
            store.append(self._key(STOPS), self._sealed(STOPS, stop) + "\n")
            with self._lock:
                self._stops_out.remove(stop)
                self._stops_sent.append(stop)
        store.set(self._key(self._node), self._sealed(self._node, record))
        if self._node == 0:
            if verdict is not None:
                store.set(self._key(VERDICT), self._sealed(VERDICT, verdict))
            nodes = list(range(1, self._nnodes))
        else:
            nodes = [0, -1]
        values = store.multi_get([*(self._key(VERDICT if n == -1 else n) for n in nodes),
                                  self._key(STOPS)])
        found = {node: _parsed(self._opened(VERDICT if node == -1 else node, value))
                 for node, value in zip(nodes, values, strict=False)}
        lines = [self._opened(STOPS, line) for line in values[-1].splitlines() if line.strip()]
        held = [line for line in lines if line is not None]
        with self._lock:
            self._records, self._read_at = found, time.monotonic()
            self._stops = [_parsed(line) for line in held]
            # Erased by a stranger (a set over the key): sent again at the next beat.
            self._stops_out.extend(s for s in self._stops_sent if s not in held)
            self._stops_sent = [s for s in self._stops_sent if s in held]

    def _sealed(self, key: int | str, value: str) -> str:
        return seal(self._secret, self._key(key), value)

    def _opened(self, key: int | str, stored: bytes | str) -> str | None:
        """The value under ``key`` if this job wrote it; else ``None``, said once per key."""
        value = unseal(self._secret, self._key(key), stored)
        if value is None and stored not in (b"", "") and key not in self._forged:
            self._forged.add(key)
            print(f"cycle: warning: ignored a value in the job's liveness store under "
                  f"'{key}' that this job did not write: another process reached node 0's "
                  "store port (close it to other users with a firewall)", file=sys.stderr,
                  flush=True)
        return value

    def _connect(self) -> Any:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=STORE_TIMEOUT_SECONDS)
        if self._node == 0:
            store = dist.TCPStore(self._host, 0, is_master=True, wait_for_workers=False,
                                  timeout=timeout)
            fresh = uuid.uuid4().hex
            self._prefix, self._secret = f"cycler/{fresh}/", secrets.token_bytes(32)
            # Every key exists before anyone reads: a get never waits for a missing one.
            for key in [*range(self._nnodes), VERDICT]:
                store.set(self._key(key), self._sealed(key, "{}"))
            store.set(self._key(STOPS), "")
            address = {"host": self._host, "port": store.port, "token": fresh,
                       "secret": self._secret.hex(), "pid": os.getpid()}
            _write_private(self._address_path, json.dumps(address).encode())
            return store
        found = _read_private(self._address_path)
        port, token, secret = found.get("port"), found.get("token"), found.get("secret")
        if not isinstance(port, int) or not isinstance(token, str) or not isinstance(secret, str):
            return None
        store = dist.TCPStore(str(found.get("host")), port, is_master=False,
                              wait_for_workers=False, timeout=timeout)
        self._prefix, self._secret = f"cycler/{token}/", bytes.fromhex(secret)
        store.get(self._key(VERDICT))  # the token's keys exist: node 0 of this address
        return store

    def _key(self, node: int | str) -> str:
        return f"{self._prefix}{node}"


def _parsed(value: str | None) -> dict[str, Any]:
    try:
        found = json.loads(value) if value is not None else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, readable by this user alone (mode 0600 before a byte is
    written: the secret is never readable by others, even for an instant)."""

    def write(handle: Any) -> None:
        os.fchmod(handle.fileno(), PRIVATE_FILE_MODE)
        handle.write(data)

    atomic_write(path, write, durable=False)


def _read_private(path: Path) -> dict[str, Any]:
    """The address file, where it is this user's and no one else's (else ``{}``: the files
    are used instead; an address another user wrote, or could read, is no line to node 0)."""
    try:
        status = path.lstat()
    except OSError:
        return {}
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() \
            or status.st_mode & 0o077:
        return {}
    return read_json_object(path)
