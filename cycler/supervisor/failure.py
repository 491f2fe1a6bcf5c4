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

TAIL_LINES = 20
_TRACEBACK_START = "Traceback (most recent call last):"
# torchrun's log lines look like "E1123 02:02:22.777000 13102 site-packages/torch/...] ...".
_TORCH_LOG_LINE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
_ROOT_CAUSE_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(.*?)\s*$")


def failure_report(stderr: str, code: int) -> str:
    """The report for workers that ended with ``code``, given torchrun's stderr ``stderr``."""
    lines = stderr.splitlines()
    cause = _root_cause(lines)
    headline = cause or f"workers failed (exit code {code})"
    body = _worker_traceback(lines) or _tail_without_torchrun(lines)
    if not body:
        return headline
    return "\n".join([headline + ":", *("  " + line for line in body)])


_VARYING = re.compile(r"^\[(?:rank|default)\d+\]:|0x[0-9a-fA-F]+|\b(?:pid|port) \d+")


def failure_signature(stderr: str) -> str | None:
    """The failing worker's traceback with what differs between two runs of the same failure
    (rank prefixes, addresses, pids) taken out; ``None`` when there is no traceback."""
    body = _worker_traceback(stderr.splitlines())
    return "\n".join(_VARYING.sub("", line) for line in body) or None


def _root_cause(lines: list[str]) -> str | None:
    try:
        start = max(i for i, line in enumerate(lines) if line.startswith("Root Cause"))
    except ValueError:
        return None
    found: dict[str, str] = {}
    for line in lines[start:start + 8]:
        match = _ROOT_CAUSE_FIELD.match(line)
        if match:
            found.setdefault(match.group(1), match.group(2))
    if "rank" not in found:
        return None
    return f"rank {found['rank']} failed with exit code {found.get('exitcode', '?')}"


def _traceback_blocks(lines: list[str]) -> list[list[str]]:
    blocks = []
    for start, line in enumerate(lines):
        if line.strip() != _TRACEBACK_START:
            continue
        end = start + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        blocks.append(lines[start:end + 1])
    return blocks


def _is_torchrun_traceback(block: list[str]) -> bool:
    return any("torch/distributed/run.py" in line or "ChildFailedError" in line
               for line in block)


def _worker_traceback(lines: list[str]) -> list[str]:
    blocks = [block for block in _traceback_blocks(lines) if not _is_torchrun_traceback(block)]
    return blocks[-1] if blocks else []


def _tail_without_torchrun(lines: list[str]) -> list[str]:
    torchrun_start = [i for i, block_line in enumerate(lines)
                      if block_line.strip() == _TRACEBACK_START
                      and _is_torchrun_traceback(lines[i:i + 12])]
    end = torchrun_start[-1] if torchrun_start else len(lines)
    kept = [line for line in lines[:end] if not _TORCH_LOG_LINE.match(line) and line.strip()]
    return kept[-TAIL_LINES:]
