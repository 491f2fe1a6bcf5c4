"""What every benchmark checks about the runs it times, before it reports a figure.

A benchmark's figure is only as good as the run behind it: a restart that made no step, an
event read from an older run's log, a process that failed, a file that was never written. Each
check here ends the benchmark with exit :data:`EXIT_BAD_RUN` and one line naming the run and
what it did not do, so no benchmark prints a negative duration or a ratio from a run that did
nothing. The helpers are small on purpose: a benchmark states what it claims in its own words.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from cycler.protocol.events import read_events

EXIT_BAD_RUN = 3
"""A timed run did not do the work its figure claims (the line on stderr names it)."""
EXIT_SKIPPED = 5
"""The machine cannot run this benchmark (the line on stderr says why)."""


class BadRun(SystemExit):
    """Raised (as a ``SystemExit`` with :data:`EXIT_BAD_RUN`) when a timed run did not do its
    work; ``str()`` is the one line printed."""

    def __init__(self, run: str, what: str) -> None:
        super().__init__(EXIT_BAD_RUN)
        self.line = f"benchmark run {run!r}: {what}"

    def __str__(self) -> str:
        return self.line


def fail(run: str, what: str) -> NoReturn:
    """End the benchmark: ``run`` did not do ``what`` it was timed for."""
    error = BadRun(run, what)
    print(error.line, file=sys.stderr, flush=True)
    raise error


def skip(reason: str) -> NoReturn:
    """End the benchmark as one this machine cannot run, saying why."""
    print(f"skipped: {reason}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_SKIPPED)


def require(condition: object, run: str, what: str) -> None:
    """``fail(run, what)`` unless ``condition`` holds."""
    if not condition:
        fail(run, what)


def duration(started: float, ended: float, run: str, what: str = "time") -> float:
    """``ended - started``, which must be positive: a run cannot end before it began."""
    seconds = ended - started
    require(seconds > 0, run, f"{what} is {seconds:.3f} s: it ended before it began "
            "(an event of an earlier run?)")
    return seconds


def ratio(value: float, baseline: float, run: str) -> float:
    """``value / baseline`` for two positive durations."""
    require(value > 0 and baseline > 0, run,
            f"cannot compare {value:.3f} s with a baseline of {baseline:.3f} s")
    return value / baseline


def exited(process: subprocess.Popen[Any] | subprocess.CompletedProcess[Any], run: str,
           expected: Iterable[int] = (0,)) -> int:
    """The process's exit code, which must be one of ``expected``."""
    code = process.returncode if isinstance(process, subprocess.CompletedProcess) \
        else process.wait()
    allowed = tuple(expected)
    require(code in allowed, run, f"exited {code}, expected {' or '.join(map(str, allowed))}")
    return int(code)


def events(root: Path, node: int = 0) -> list[dict[str, Any]]:
    """The events log of ``cycle run`` on ``node`` under the checkpoint ``root`` ([] if none),
    read as ``cycle status`` reads it."""
    return read_events(root / ".cycler" / f"events-node{node}.jsonl")


def events_since(root: Path, started: float, kind: str, node: int = 0) -> list[dict[str, Any]]:
    """The ``kind`` events that the run started at wall time ``started`` recorded: the log
    of a copied root also holds the earlier runs' events, which must never be read as this
    run's."""
    return [e for e in events(root, node) if e.get("event") == kind
            and float(e.get("time", 0.0)) >= started]


def first_step_since(root: Path, started: float, run: str, node: int = 0) -> dict[str, Any]:
    """This run's ``first_step`` event; fails when the run made no step of its own."""
    found = events_since(root, started, "first_step", node)
    require(found, run, "made no step of its own (no first_step event after its start)")
    return found[0]


def exists(path: Path, run: str) -> Path:
    """``path``, which the run must have written."""
    require(path.exists(), run, f"did not write {path}")
    return path
