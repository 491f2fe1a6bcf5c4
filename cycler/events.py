"""The job's append-only events log (JSON lines under ``<root>/.cycler/``).

Every line is one event written with a single ``write`` on an ``O_APPEND`` descriptor, so lines
from concurrent writers never interleave. Readers skip a torn last line (a writer killed mid-way).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class EventLog:
    """Appends events like ``{"time": ..., "event": "signal", "signal": "SIGTERM", ...}``."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._host = socket.gethostname()

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event; no fsync: this is a record for people, not training state."""
        record = {"time": self._clock(), "event": event, "host": self._host, "pid": os.getpid()}
        record.update(fields)
        line = (json.dumps(record, default=str, sort_keys=True) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return record


def read_events(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The events in ``path``, oldest first; the last ``limit`` only when given."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            events.append(record)
    return events if limit is None else events[-limit:]
