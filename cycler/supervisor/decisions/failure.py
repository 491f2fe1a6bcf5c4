"""One readable block that says which worker failed and why, from torchrun's stderr.

torchrun's own report names the failing rank and exit code ("Root Cause") but, unless the script
uses ``@record``, not the traceback, and it buries both under torchrun's own traceback. The
worker's traceback is in the same stream, because the workers inherit torchrun's stderr, which the
supervisor pipes through itself. So the block is: the root cause's rank and exit code, then the
last traceback that is not torchrun's, or the last lines of output when there is none (a crash
in native code, a missing script).
"""

from __future__ import annotations

import re
import signal

TAIL_LINES = 20
_TRACEBACK_START = "Traceback (most recent call last):"
# torchrun's log lines look like "E1123 02:02:22.777000 13102 site-packages/torch/...] ...".
_TORCH_LOG_LINE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
_ROOT_CAUSE_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(.*?)\s*$")
# torch prefixes what a rank with a process group prints of its uncaught exception.
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]: ?")


def failure_report(stderr: str, code: int) -> str:
    """The report for workers that ended with ``code``, given torchrun's stderr ``stderr``."""
    lines = _lines(stderr)
    cause = _root_cause(lines)
    headline = cause or f"workers failed (exit code {code})"
    full = full_disk(lines)
    body = [full] if full else worker_traceback(lines) or _tail_without_torchrun(lines)
    if not body:
        return headline
    return "\n".join([headline + ":", *("  " + line for line in body)])


_VARYING = re.compile(r"^\[(?:rank|default)\d+\]:|0x[0-9a-fA-F]+|\b(?:pid|port) \d+")
_FRAME = re.compile(r"^\s*File \"")
_TEMPORARY = re.compile(r"(?:/tmp|/var/tmp|/dev/shm|/run/user/\d+)/[^\s'\"):,]*")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SIGNAL_DEATH = re.compile(r"^-(\d+)\b")


def failure_signature(stderr: str) -> str | None:
    """What two runs of the same failure share: the failing worker's traceback, its frames
    (file, line, function: the kind of failure) kept and, in the other lines (the message),
    what differs between runs taken out: rank prefixes, addresses, pids, ports, temporary
    paths, numbers (a time, a count of seconds). With no traceback, the signal that killed the
    failing rank (``killed by SIGSEGV``); ``None`` when there is neither."""
    lines = _lines(stderr)
    body = worker_traceback(lines)
    if body:
        return "\n".join(_without_varying(line) for line in body)
    return signal_death(lines)


_FULL_DISK = re.compile(r"^cycler: rank \S+: .*(?:no space left on|the disk is full)")
"""The one line a worker prints instead of its traceback when it dies of a full disk
(:func:`cycler._fs.full_disk_said_in_one_line`)."""


def full_disk(lines: list[str]) -> str | None:
    """The last line a worker printed as it died of a full disk, if one did: the cause, before
    any traceback (the other ranks' broken connections print theirs after it)."""
    found = (_RANK_PREFIX.sub("", line) for line in reversed(lines))
    return next((line for line in found if _FULL_DISK.match(line)), None)


def _lines(stderr: str) -> list[str]:
    """``stderr``'s lines, each without the ``[rank0]:`` that torch puts before a worker's
    traceback once its process group exists."""
    return [_RANK_PREFIX.sub("", line) for line in stderr.splitlines()]


def _without_varying(line: str) -> str:
    line = _VARYING.sub("", line)
    if _FRAME.match(line):
        return line  # the frame's line number is where it failed: the kind, not a detail
    return _NUMBER.sub("N", _TEMPORARY.sub("<temporary path>", line))


def signal_death(lines: list[str]) -> str | None:
    """``killed by SIGSEGV`` when torchrun's root cause is a rank killed by a signal."""
    code = _root_cause_fields(lines).get("exitcode", "")
    match = _SIGNAL_DEATH.match(code)
    if match is None:
        return None
    number = int(match.group(1))
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"killed by signal {number}"


def _root_cause(lines: list[str]) -> str | None:
    found = _root_cause_fields(lines)
    if "rank" not in found:
        return None
    return f"rank {found['rank']} failed with exit code {found.get('exitcode', '?')}"


def _root_cause_fields(lines: list[str]) -> dict[str, str]:
    try:
        start = max(i for i, line in enumerate(lines) if line.startswith("Root Cause"))
    except ValueError:
        return {}
    found: dict[str, str] = {}
    for line in lines[start:start + 8]:
        match = _ROOT_CAUSE_FIELD.match(line)
        if match:
            found.setdefault(match.group(1), match.group(2))
    return found


def _traceback_blocks(lines: list[str]) -> list[tuple[int, list[str]]]:
    blocks = []
    for start, line in enumerate(lines):
        if line.strip() != _TRACEBACK_START:
            continue
        end = start + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        blocks.append((start, lines[start:end + 1]))
    return blocks


def _is_whole(block: list[str]) -> bool:
    """Whether a traceback got to its exception: a worker that torchrun ended while it was
    printing one (the other ranks of a failed group) leaves a head without it."""
    last = block[-1]
    return (len(block) > 2 and bool(_FRAME.match(block[1])) and not last.startswith(" ")
            and not _TORCH_LOG_LINE.match(last) and last.strip() != _TRACEBACK_START)


def _is_torchrun_traceback(block: list[str]) -> bool:
    return any("torch/distributed/run.py" in line or "ChildFailedError" in line
               for line in block)


def worker_traceback(lines: list[str]) -> list[str]:
    """The last traceback in ``lines`` that is not torchrun's own, its exception line last:
    a ``Traceback (most recent call last):`` block, or the frame, code and caret that Python
    prints alone for a script that does not compile (``[]``: neither)."""
    lines = [_RANK_PREFIX.sub("", line) for line in lines]  # torchrun's --tee, filters
    blocks = [(start, block) for start, block in _traceback_blocks(lines)
              if _is_whole(block) and not _is_torchrun_traceback(block)]
    # The one that ends last; of a compile error inside a Traceback block, the whole block.
    found = max([*blocks, *_compile_errors(lines)], default=None,
                key=lambda pair: (pair[0] + len(pair[1]), -pair[0]))
    return [] if found is None else found[1]


_COMPILE_ERROR = re.compile(r"^(?:SyntaxError|IndentationError|TabError)(?::|$)")


def _compile_errors(lines: list[str]) -> list[tuple[int, list[str]]]:
    """Python's report of a script that does not compile, which has no ``Traceback`` line:
    ``File "...", line N``, the code, the caret, then ``SyntaxError: ...``."""
    found = []
    for end, line in enumerate(lines):
        if not _COMPILE_ERROR.match(line):
            continue
        start = end
        while start > 0 and lines[start - 1].startswith(" "):
            start -= 1
        if start < end and _FRAME.match(lines[start]):
            found.append((start, lines[start:end + 1]))
    return found


def _tail_without_torchrun(lines: list[str]) -> list[str]:
    torchrun_start = [i for i, block_line in enumerate(lines)
                      if block_line.strip() == _TRACEBACK_START
                      and _is_torchrun_traceback(lines[i:i + 12])]
    end = torchrun_start[-1] if torchrun_start else len(lines)
    kept = [line for line in lines[:end] if not _TORCH_LOG_LINE.match(line) and line.strip()]
    return kept[-TAIL_LINES:]
