"""What kind of failure ended the workers, told from what they printed (pure: text in, a
verdict out), and so what a restart can do about it (:class:`.budget.RestartBudget`):

- ``script``: the script's code (``SyntaxError``, ``ImportError``, ``NameError``,
  ``AttributeError`` ...). The same code fails the same way, so the same failure twice in a
  row, with no checkpoint in between, ends the job: whatever the script imported, and whether or
  not cycle could see its steps.
- ``resource``: the OS refused something the script needs (a missing file, a refused
  connection, an address in use, memory). It may come back by itself, so it is retried with
  backoff within ``--max-restarts``, however often it repeats; when it persists, the end names
  it.
- ``other``: anything else (a ``RuntimeError``, a death by a signal): the same failure twice
  before the first step ends the job (cycle sees the steps of scripts that import cycler);
  otherwise only the budget counts.

What is read is the failing worker's traceback (:func:`.failure.worker_traceback`), whatever
started the worker (forked from the agent or a fresh interpreter), or torchrun's own report
when no worker ran (its store could not listen on the port).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from cycler.supervisor.decisions.failure import (
    failure_signature,
    full_disk,
    signal_death,
    worker_traceback,
)


class FailureKind(str, enum.Enum):
    SCRIPT = "script"
    RESOURCE = "resource"
    OTHER = "other"


@dataclass(frozen=True)
class WorkerFailure:
    """How the failing worker failed, as far as its output says."""

    kind: FailureKind
    error: str
    """One line: the exception as Python printed it (``ModuleNotFoundError: No module named
    'x'``), or ``killed by SIGKILL``."""
    signature: str | None = None
    """What two runs of the same failure share (:func:`.failure.failure_signature`)."""
    resource: str | None = None
    """With ``resource``: what the OS refused, in one phrase (``the file /data/x is
    missing``, ``port 29500 is in use by another process``)."""


SCRIPT_ERRORS = frozenset({
    "SyntaxError", "IndentationError", "TabError", "ImportError", "ModuleNotFoundError",
    "NameError", "UnboundLocalError", "AttributeError", "TypeError", "NotImplementedError",
    "RecursionError"})
"""Exceptions that say the script's code is wrong: a new start runs the same code."""

_CONNECTION_ERRORS = frozenset({"ConnectionRefusedError", "ConnectionResetError",
                                "ConnectionAbortedError", "ConnectionError", "BrokenPipeError",
                                "TimeoutError", "DistNetworkError"})
_OS_ERRORS = frozenset({"OSError", "IOError", "FileNotFoundError", "PermissionError",
                        "NotADirectoryError", "IsADirectoryError", "FileExistsError",
                        "BlockingIOError", "InterruptedError", "EnvironmentError"})
_MEMORY_ERRORS = frozenset({"MemoryError", "OutOfMemoryError"})

_EXCEPTION_LINE = re.compile(r"^(?:\[(?:rank|default)\d+\]:)?([A-Za-z_][\w.]*)(?::\s*(.*))?$")
_QUOTED_PATH = re.compile(r"""No such file or directory: ['"]([^'"]+)['"]""")
_ANY_QUOTED = re.compile(r""": ['"]([^'"]+)['"]\s*$""")
_ADDRESS_IN_USE = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
_PORT = re.compile(r"\bport:? (\d+)")
_HOST_PORT = re.compile(r"(\[[^\]\s]+\]|[\w.-]+):(\d{2,5})\b")
_OUT_OF_MEMORY = re.compile(r"out of memory|not enough memory|can't allocate memory",
                            re.IGNORECASE)
"""torch's words for an allocation refused: CUDA's, and the CPU allocator's (``DefaultCPUAllocator:
can't allocate memory: ... (Cannot allocate memory)`` on torch 2.13, ``not enough memory`` in
older releases)."""


def classify(stderr: str) -> WorkerFailure | None:
    """The failure the workers' (and torchrun's) ``stderr`` shows; ``None`` when it shows
    none (no traceback, no death by a signal)."""
    lines = stderr.splitlines()
    full = full_disk(lines)
    if full is not None:
        said = full.split(": ", 2)[-1]
        return WorkerFailure(FailureKind.RESOURCE, full, "the disk is full",
                             f"the disk is full: {said}")
    body = worker_traceback(lines)
    signature = failure_signature(stderr)
    if body:
        return _from_exception(body[-1].strip(), signature)
    in_use = port_in_use(lines)
    if in_use is not None:
        return WorkerFailure(FailureKind.RESOURCE, in_use, signature or in_use, in_use)
    death = signal_death(lines)
    if death is None:
        return None
    if death == "killed by SIGKILL":
        return WorkerFailure(FailureKind.RESOURCE, death, death,
                             "killed by SIGKILL, as the kernel's out-of-memory killer does")
    return WorkerFailure(FailureKind.OTHER, death, death)


def port_in_use(lines: list[str]) -> str | None:
    """``port N is in use by another process`` when torchrun's store could not listen
    (EADDRINUSE in its report), else ``None``."""
    for line in reversed(lines):
        if _ADDRESS_IN_USE.search(line):
            port = _PORT.search(line)
            where = f"port {port.group(1)}" if port else "the rendezvous port"
            return f"{where} is in use by another process (EADDRINUSE)"
    return None


def _from_exception(line: str, signature: str | None) -> WorkerFailure:
    match = _EXCEPTION_LINE.match(line)
    if match is None:
        return WorkerFailure(FailureKind.OTHER, line, signature)
    name, message = match.group(1).rsplit(".", 1)[-1], match.group(2) or ""
    resource = _resource(name, message, line)
    if resource is not None:
        return WorkerFailure(FailureKind.RESOURCE, line, signature, resource)
    kind = FailureKind.SCRIPT if name in SCRIPT_ERRORS else FailureKind.OTHER
    return WorkerFailure(kind, line, signature)


def _resource(name: str, message: str, line: str) -> str | None:
    """What the OS refused, for an exception that says it did; ``None`` for any other."""
    if _ADDRESS_IN_USE.search(message):
        port = _PORT.search(message) or _HOST_PORT.search(message)
        where = f"port {port.group(port.lastindex or 1)}" if port else "an address"
        return f"{where} is in use by another process ({name})"
    if name in _MEMORY_ERRORS or (name == "RuntimeError" and _OUT_OF_MEMORY.search(message)):
        return f"out of memory ({line})"
    if name in _CONNECTION_ERRORS:
        address = _HOST_PORT.search(message)
        if address is not None:
            return f"a connection to {address.group(0)} failed ({name})"
        return f"a connection failed ({line})"
    if name in _OS_ERRORS:
        missing = _QUOTED_PATH.search(message)
        if missing is not None:
            return f"the file {missing.group(1)} is missing ({name})"
        path = _ANY_QUOTED.search(message)
        return f"{path.group(1)}: {line}" if path else line
    return None
