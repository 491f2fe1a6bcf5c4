"""A job's life on one line per node (``cycle status``): what each stretch of time was.

Each node's events log (oldest first) becomes a string of ``width`` cells over the job's span,
each cell the state the node spent most of that stretch in:

    ``=`` training   ``s`` starting (start to the first step)   ``R`` restarting after a
    failure or a hang   ``S`` stopping (request to exit)   ``H`` a hang found   `` `` not running

A pure function of the events, like :mod:`cycler.protocol.goodput`.
"""

from __future__ import annotations

from typing import Any

TRAINING, STARTING, RESTARTING, STOPPING, HANG, IDLE = "=", "s", "R", "S", "H", " "
LEGEND = ("= training  s starting  R restarting  S stopping  H hang found  "
          "(blank: not running)")


def spans(events: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(from, to, state) stretches of one node's events; hangs as zero-length marks."""
    out: list[tuple[float, float, str]] = []
    state, since = IDLE, None
    for event in events:
        name, when = event.get("event"), float(event.get("time", 0.0))
        new = _state_after(name, event, state)
        if new is not None and new != state:
            if since is not None and state != IDLE:
                out.append((since, when, state))
            state, since = new, when
        if name == "hang":
            out.append((when, when, HANG))
    if since is not None and state != IDLE and events:
        out.append((since, float(events[-1].get("time", since)), state))
    return out


def _state_after(name: Any, event: dict[str, Any], state: str) -> str | None:
    if name == "start":
        return STARTING
    if name == "first_step":
        return TRAINING if state in (STARTING, RESTARTING) else None
    if name in ("stop_requested", "stopped_by_another_node") or (
            name == "signal" and event.get("effect") == "checkpoint_and_exit"):
        return STOPPING
    if name == "hang" or (name == "workers_exited" and event.get("code") not in (0, None)
                          and state != STOPPING):
        return RESTARTING
    if name == "exit":
        return IDLE
    return None


def timeline(by_node: dict[int, list[dict[str, Any]]], width: int = 60) -> dict[int, str]:
    """One line of ``width`` cells per node, over the span of every node's events."""
    times = [float(e.get("time", 0.0)) for events in by_node.values() for e in events]
    if not times:
        return {}
    first, last = min(times), max(times)
    cell = max((last - first) / width, 1e-9)
    lines = {}
    for node, events in sorted(by_node.items()):
        cells = [IDLE] * width
        weight = [0.0] * width
        for start, end, state in spans(events):
            low = min(int((start - first) / cell), width - 1)
            high = min(int((end - first) / cell), width - 1)
            for index in range(low, high + 1):
                if state == HANG:
                    cells[index], weight[index] = HANG, float("inf")
                    continue
                overlap = min(end, first + (index + 1) * cell) - max(start, first + index * cell)
                if overlap > weight[index]:
                    cells[index], weight[index] = state, overlap
        lines[node] = "".join(cells)
    return lines
