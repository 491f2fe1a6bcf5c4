"""The job's append-only events log (JSON lines under ``<root>/.cycler/``).

Every line is one event written with a single ``write`` on an ``O_APPEND`` descriptor, so lines
from concurrent writers never interleave. Readers skip a torn last line (a writer killed mid-way).
"""

from __future__ import annotations

import json
import os
import socket
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cycler.protocol.clocks import process_age

MESSAGES = {
    "start": "supervising {script}: {nproc_per_node:#worker} on node {node_rank} of {nnodes}",
    "workers_started": "started torchrun (pid {torchrun_pid}, start {start})",
    "signal": "{signal}: {effect}",
    "stop_requested.agreed_step": "asked the workers to checkpoint at a step they agree on and "
                                  "exit, within {grace:g} s (they read the control file)",
    "stop_requested.next_commit": "the workers commit through cycler's savers but do not read "
                                  "the control file: ending them after their next commit, or "
                                  "in {grace:g} s",
    "stop_requested.signal": "the workers use neither StepControl nor cycler's savers: "
                             "forwarding the signal to them, as torchrun does; they have "
                             "{grace:g} s to exit",
    "stop_requested.signal.own_handler": "the workers have their own SIGTERM handler: "
                                         "sending them SIGTERM at once, as torchrun does; "
                                         "they have {grace:g} s to exit",
    "stop_requested.undecided": "the workers imported cycler but built no StepControl or saver "
                                "yet: waiting a few seconds for them to",
    "deadline": "the stop must be over in {seconds_left:g} s, not the {grace:g} s grace: {why}",
    "stop_after_commit": "checkpoint {index} is the stop's checkpoint: SIGTERM to the workers",
    "stop_after_training": "the workers had ended their training loop before the stop reached "
                           "them: the job finished, nothing to stop or requeue",
    "stop_handled_by_script": "the script handled the signal and exited 0; cycle sees no "
                              "checkpoint of its own to name",
    "checkpoint_committed": "checkpoint {index} committed",
    "checkpoints_committed": "checkpoints {first} to {last} committed",
    "torchrun_cut_short": "every worker exited after the stop checkpoint: ending torchrun "
                          "(pid {torchrun_pid})",
    "workers_exited": "workers exited with code {code}",
    "hang": "a hang: {summary}; killing the workers",
    "first_step": "the workers made their first step",
    "waiting_for_node": "waiting for node {node}: no heartbeat yet",
    "start_failed": "the workers failed (code {code}) before their first step: the start failed "
                    "(imports, init_process_group, loading), not the training ({count} so far)",
    "awaiting_peers": "torchrun failed: waiting up to {seconds:g} s for the other nodes' "
                      "verdict (a node that is gone makes this a stop, not a failure)",
    "resource_failed": "the workers failed on a resource: {resource}; restarting with backoff, "
                       "it may come back",
    "restart_scheduled": "restarting in {delay:g} s (restart {restart} of {of} since the last "
                         "checkpoint)",
    "restart_together": "workers failed (code {code}): torchrun restarts them with every "
                        "node's (restart {restart} of {of} since the last checkpoint)",
    "no_restart_during_stop": "workers failed (code {code}) during a stop: not restarted, and "
                              "not counted against --max-restarts",
    "peer_lost": "node {node} {why}: ending this node's workers",
    "failed_after_training": "a worker failed (code {code}) after its training loop ended, and "
                             "node {node}'s workers finished: the training is done, not "
                             "restarted",
    "grace_expired": "the stop's {seconds:g} s are over: SIGTERM to every process of the job",
    "kill": "still running {after:g} s after SIGTERM: SIGKILL",
    "signal_sent": "sent {signal} to the job",
    "signal_forwarded": "sent {signal} to the workers",
    "stop_without_new_checkpoint": "the stop made no new checkpoint; the next start resumes "
                                   "from checkpoint {resume_from}",
    "stopped_by_another_node": "another node asked for this stop",
    "requeue": "scontrol requeue {job_id}: {detail}",
    "requeue_skipped": "not requeued: {requeues:#requeue} reached --max-requeues {max_requeues}",
    "exit": "exit {code}: {reason}",
    "ended": "cycle run ends (exit {code})",
    "last_progress": "the previous workers' newest progress: step {step}",
    "persisted": "persisted checkpoint {index} from the memory tier to the checkpoint root "
                 "({why})",
    "stop_copy": "checkpoint {index}, the stop's, had not reached the checkpoint root when the "
                 "workers exited: cycle run copies it there itself, in the {seconds_left:g} s "
                 "left before the stop's deadline",
    "stop_copy_landed": "cycle run finished the stop's copy: checkpoint {index} is in the "
                        "checkpoint root after {seconds:g} s, {spare:g} s before the stop's "
                        "deadline",
    "memory_tier_removed": "removed the memory tier {root} (the job ended)",
    "persist_failed": "the newest checkpoint is only in this node's memory, at {newest}: "
                      "persisting it to the checkpoint root failed ({error}); exit {code}, not "
                      "{planned}, and the memory tier is kept: a rerun on this node resumes "
                      "from it",
    "requeue_withheld": "not requeued: a requeued job starts on another node, from the older "
                        "checkpoint in the checkpoint root, while the newest state is in this "
                        "node's memory ({newest})",
    "control_unwritable": "cannot write the control file ({error}): the workers are told by "
                          "SIGTERM instead, and the stop may end without a checkpoint",
    "runtime_dir_remade": "the job's runtime directory {path} was removed while the job ran "
                          "(a logout's cleanup?): made it again for the control file",
    "runtime_dir_full": "the tmpfs of the job's runtime directory {path} is full: freed the "
                        "space kept there for the control file",
    "control_copy_unwritable": "cannot write the control file's copy in the checkpoint root "
                               "({error}): this node's workers were told on the node and the "
                               "stop goes on; the other nodes learn of it from the store, or "
                               "from their workers' agreed stop",
    "checkpoint_interval": "checkpoint interval: every {steps:#step} (about {seconds:g} s) "
                           "from a save stall of {stall:g} s and a mean time between failures "
                           "of {mtbf_hours:g} h ({failures:#failure} in {wall_hours:g} h)",
    "checkpoint_interval.first": "checkpoint interval: every {steps:#step} (about {seconds:g} "
                                 "s) until a save's stall is measured",
    "compile_cache_carried": "{said}",
    "compile_cache_not_carried": "{said}",
    "replay_verified": "{said}",
    "replay_diverged": "{said}",
    "replay_unchecked": "{said}",
    "preemption_notices": "polling {cloud}'s metadata service at {endpoint} for preemption "
                          "notices",
}
"""One readable sentence per event (``event.path`` first where a stop's path picks it), for
``cycle run``'s log and ``cycle status``."""

HISTORY = frozenset({
    "start", "signal", "stop_requested", "deadline", "stop_after_commit", "stop_handled_by_script",
    "stop_after_training",
    "stop_without_new_checkpoint", "stopped_by_another_node", "grace_expired", "kill",
    "restart_scheduled", "restart_together", "no_restart_during_stop", "peer_lost",
    "failed_after_training", "requeue",
    "requeue_skipped", "exit",
    "hang", "start_failed", "resource_failed", "waiting_for_node",
    "persisted", "stop_copy", "stop_copy_landed",
    "memory_tier_removed",
    "persist_failed", "requeue_withheld", "control_unwritable",
    "control_copy_unwritable", "runtime_dir_remade", "runtime_dir_full",
    "checkpoint_committed", "checkpoint_interval", "compile_cache_not_carried",
    "replay_verified", "replay_diverged", "replay_unchecked",
})
"""The events ``cycle status`` shows: what the job went through, not every checkpoint."""


def process_start() -> dict[str, Any]:
    """The ``start`` event's ``process_started``: when this process began (wall clock), so that
    ``cycle status`` counts cycle's own start before its first event as part of the run."""
    age = process_age()
    return {} if age is None else {"process_started": round(time.time() - age, 3)}


def counted(number: object, word: str) -> str:
    """``1 worker``, ``2 workers``; ``word`` may give both forms: ``kill/kills``."""
    one, _, many = word.partition("/")
    return f"{number} {one if number == 1 else many or one + 's'}"


class _Sentence(string.Formatter):
    """``str.format_map`` that also counts: ``{n:#worker}`` is ``1 worker`` or ``2 workers``."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec.startswith("#"):
            return counted(value, format_spec[1:])
        return super().format_field(value, format_spec)


_SENTENCE = _Sentence()


def describe(event: str, fields: dict[str, Any]) -> str:
    """``event`` with ``fields`` as one sentence (``name key=value ...`` if it has none)."""
    try:
        path = f"{event}.{fields.get('path')}"
        template = (fields.get("own_handler") and MESSAGES.get(f"{path}.own_handler")
                    or MESSAGES.get(path) or MESSAGES[event])
        return _SENTENCE.vformat(template, (), fields)
    except (KeyError, ValueError, IndexError):
        return " ".join([event, *(f"{key}={value}" for key, value in fields.items()
                                  if key not in ("time", "host", "pid"))])


def job_history(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events worth showing, oldest first: a run of ``checkpoint_committed`` becomes one
    ``checkpoints_committed`` (``first``, ``last``, ``count``); signals that change nothing and
    routine exits of workers are left out."""
    shown: list[dict[str, Any]] = []
    for record in events:
        previous = shown[-1] if shown else {}
        if (record.get("event") == "checkpoint_committed"
                and previous.get("event") in ("checkpoint_committed", "checkpoints_committed")):
            shown[-1] = {**previous, "event": "checkpoints_committed",
                         "first": previous.get("first", previous.get("index")),
                         "last": record.get("index"), "count": previous.get("count", 1) + 1}
        elif record.get("event") in HISTORY and record.get("effect") != "ignored":
            shown.append(dict(record))
    return shown


def history_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    """How many starts, stops, restarts and requeues the events record."""
    def count(name: str) -> int:
        return sum(1 for record in events if record.get("event") == name)

    restarts = count("restart_scheduled") + count("restart_together")
    counts = {"starts": count("start"), "stops": _stops(events),
              "restarts": restarts, "requeues": count("requeue")}
    hangs = count("hang")
    return {**counts, "hangs": hangs} if hangs else counts


def _stops(events: list[dict[str, Any]]) -> int:
    """Stops, one per stop: its path may be logged again when the workers' announcement
    changes it (an undecided script, a saver's own handler)."""
    stops, stopping = 0, False
    for record in events:
        name = record.get("event")
        if name == "stop_requested":
            stops, stopping = stops + (not stopping), True
        elif name in ("start", "workers_started", "exit"):
            stopping = False
    return stops


class EventLog:
    """Appends events like ``{"time": ..., "event": "signal", "signal": "SIGTERM", ...}``."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._host = socket.gethostname()

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event that happens now; no fsync: this is a record for people, not
        training state."""
        return self.append_at(self._clock(), event, fields)

    def append_at(self, when: float, event: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Append one event that happened at ``when`` (written later, by another thread)."""
        record = {"time": when, "event": event, "host": self._host, "pid": os.getpid()}
        record.update(fields)
        line = (json.dumps(record, default=str, sort_keys=True) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return record


LATEST_TIME = 2.0**33
"""An event's time must be before this (the year 2242): NaN, infinities and 1e300 are none."""


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
        # A line another tool or a broken disk wrote must not crash `cycle status`, nor skew
        # its goodput and timeline: every reader relies on a named event at a real time.
        when = record.get("time") if isinstance(record, dict) else None
        if (isinstance(record, dict) and isinstance(record.get("event"), str)
                and isinstance(when, int | float) and not isinstance(when, bool)
                and 0 <= when < LATEST_TIME):
            events.append(record)
    return events if limit is None else events[-limit:]
