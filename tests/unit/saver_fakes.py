"""Fakes and makers for the saver's parts: a fake ``Coordinator`` (the real rounds over an
in-process store, the ranks as threads of one process, no process group) and checkpoints made
by hand."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cycler.checkpoint.coordination import Coordinator
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.linking import finalize
from cycler.checkpoint.listing import list_checkpoints
from cycler.checkpoint.manifest import sealed

WAIT = datetime.timedelta(seconds=30)
"""How long a rank waits for another: long enough never to be reached by a test that passes."""


class FakeStore:
    """The part of a c10d store the coordinator uses, in memory, shared by the ranks' threads."""

    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}
        self._changed = threading.Condition()
        self.lookups: dict[str, int] = {}
        """Per calling thread's name, the keys its calls named (a wait on W keys counts W)."""

    def _looked_up(self, keys: int = 1) -> None:
        name = threading.current_thread().name
        self.lookups[name] = self.lookups.get(name, 0) + keys

    def set(self, key: str, value: str | bytes) -> None:
        with self._changed:
            self._looked_up()
            self._values[key] = value.encode() if isinstance(value, str) else value
            self._changed.notify_all()

    def get(self, key: str) -> bytes:
        with self._changed:
            self._looked_up()
            return self._values[key]

    def add(self, key: str, amount: int) -> int:
        with self._changed:
            self._looked_up()
            value = int(self._values.get(key, b"0")) + amount
            self._values[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        with self._changed:
            self._looked_up(len(keys))
            if not self._changed.wait_for(lambda: all(k in self._values for k in keys),
                                          timeout.total_seconds()):
                raise RuntimeError(f"wait timeout for {keys}")

    def check(self, keys: list[str]) -> bool:
        with self._changed:
            self._looked_up(len(keys))
            return all(key in self._values for key in keys)

    def delete_key(self, key: str) -> bool:
        with self._changed:
            return self._values.pop(key, None) is not None

    def keys(self) -> list[str]:
        with self._changed:
            return sorted(self._values)


class FakeCoordinator(Coordinator):
    """Rank ``rank`` of ``world_size`` over ``store`` (``None``: a lone process)."""

    def __init__(self, rank: int = 0, world_size: int = 1, store: FakeStore | None = None,
                 namespace: str = "saver", timeout: datetime.timedelta = WAIT) -> None:
        super().__init__(namespace, timeout)
        self._bound = (rank, world_size, store)


def on_every_rank(world_size: int, work: Callable[[FakeCoordinator], Any],
                  ) -> list[tuple[Any, BaseException | None]]:
    """Run ``work`` on every rank of a job of ``world_size``, each on a thread with its own
    coordinator over one store; per rank (in rank order) what it returned and what it raised."""
    store = FakeStore()
    outcomes: list[tuple[Any, BaseException | None]] = [(None, None)] * world_size

    def rank(number: int) -> None:
        try:
            outcomes[number] = (work(FakeCoordinator(number, world_size, store)), None)
        except BaseException as error:  # noqa: BLE001 (reported to the test)
            outcomes[number] = (None, error)

    threads = [threading.Thread(target=rank, args=(n,), name=f"rank-{n}")
               for n in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * WAIT.total_seconds())
        assert not thread.is_alive(), f"{thread.name} still waits"
    return outcomes


def checkpoint(layout: CheckpointLayout, index: int, *, pinned: bool = False,
               committed: bool = True) -> Path:
    """A checkpoint directory of ``layout`` with one file, committed (the link moved to it) or
    torn (no manifest)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.adopt()  # cycler prepares here from index 0: a directory without a manifest is torn
    name = CheckpointName(layout.prefix, index, pinned)
    path = layout.path_of(name)
    path.mkdir()
    (path / "model.pt").write_bytes(b"weights %d" % index)
    if committed:
        finalize(layout, name, sealed(path, index=index))
    return path


def indices(root: Path) -> list[str]:
    """The checkpoints of ``root`` as ``"3"`` (committed), ``"3P"`` (pinned), ``"3T"`` (torn)."""
    return [f"{c.index}{'P' if c.pinned else ''}{'' if c.valid else 'T'}"
            for c in list_checkpoints(root, commit_state_only=True)]
