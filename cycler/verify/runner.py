"""Drive real ``cycle run`` processes: one run uninterrupted, one stopped and killed at chosen
steps and started again after each stop, as a scheduler would requeue it.

Each run has its own checkpoint root, log and working directory under the scratch directory
(``<run>/work``: empty at the start, every start of the run works in it, so the script's
relative outputs land at the same relative paths there and never in the caller's directory);
the user's ``cycle run`` options and script arguments go through unchanged after
``--checkpoint-dir``. The runs' environment has ``CYCLER_VERIFY=1``: the script's
``StepControl`` adds verify's checkpoints and the integrations commit the end of training. A
stop is the stop signal sent to ``cycle run`` (it exits 75 after the stop checkpoint, and is
started again); a kill is ``kill -9`` of one worker (``cycle run`` restarts the workers itself).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cycler._fs import pid_alive
from cycler.checkpoint.memory_roots import memory_base, memory_root, runtime_dir
from cycler.errors import ConfigError, CyclerError
from cycler.protocol.environment import ENV_VERIFY
from cycler.protocol.exit_codes import EXIT_REQUEUE, EXIT_SUCCESS, EXIT_USAGE
from cycler.protocol.node_local import NodeFiles
from cycler.protocol.progress import Reading, read_beacons
from cycler.verify.capture import Capture
from cycler.verify.plan import KILL, Interruption

POLL_SECONDS = 0.01
# cycle run runs in a session of its own (a Ctrl-C is verify's to handle), so it must still
# stop when verify dies, even by SIGKILL: the kernel sends it the stop signal then
# (PR_SET_PDEATHSIG, set in the child before exec: verify's progress display runs a thread,
# which rules out a preexec_fn).
_STOPPED_WITH_VERIFY = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
_ABORT_GRACE = 30.0
# Names in the environment that would send a run's checkpoints elsewhere or make it a part of
# the caller's own job (a Slurm allocation's node count, an outer cycle run's control file).
_NOT_PASSED = ("CYCLER_", "SLURM_", "CHECKPOINT_ARTIFACT_PATH", "LOSSY_ARTIFACT_PATH")


class RunFailed(CyclerError):
    """A run of the script failed (``cycle run`` exited neither 0 nor 75 where it should have)."""

    exit_code = 4


@dataclass(frozen=True)
class Resume:
    """One interruption as it happened, and the checkpoint the run went on from."""

    interruption: Interruption
    sent_at_step: int
    from_step: int | None
    from_name: str | None

    def as_dict(self) -> dict[str, object]:
        return {**self.interruption.as_dict(), "sent_at_step": self.sent_at_step,
                "resumed_from_step": self.from_step, "resumed_from": self.from_name}


@dataclass
class RunRecord:
    """One run of the script: its checkpoints, its interruptions, its cost."""

    name: str
    capture: Capture
    log: Path
    workdir: Path
    """The run's working directory (what the script wrote with relative paths)."""
    seconds: float = 0.0
    starts: int = 0
    last_step: int = -1
    resumes: list[Resume] = field(default_factory=list)
    finished: bool = False
    """Whether the script ran to its end (``cycle run`` exited 0)."""
    startup_seconds: float = 0.0
    """Of :attr:`seconds`, the starts' time to their first step (the interpreter, cycle run,
    torchrun, the stack's imports, the process group, building the model, loading the
    checkpoint): where a short run's time goes."""
    stopping_seconds: float = 0.0
    """Of :attr:`seconds`, the time from each stop signal to ``cycle run``'s exit."""


Progress = Callable[[str, int, int], None]
"""Called with (run name, last step seen, checkpoints kept) while a run goes on."""


class Runner:
    """Starts ``cycle run`` with the user's options, in a scratch directory of its own."""

    def __init__(self, cycle_run: Sequence[str], run_args: list[str], scratch: Path, *,
                 environ: Mapping[str, str] | None = None,
                 progress: Progress = lambda name, step, kept: None,
                 imports: Path | None = None) -> None:
        self.cycle_run = list(cycle_run)
        """The command that starts ``cycle run`` (the CLI's own: the library never names it)."""
        self.run_args = run_args
        self.scratch = scratch
        source = os.environ if environ is None else environ
        self.environ = {k: v for k, v in source.items() if not k.startswith(_NOT_PASSED)}
        self.environ[ENV_VERIFY] = "1"
        if imports is not None:
            self.environ["PYTHONPATH"] = os.pathsep.join(
                [str(imports), *filter(None, [self.environ.get("PYTHONPATH")])])
        self.progress = progress

    def run(self, name: str, interruptions: Sequence[Interruption] = (), *,
            count_delay: float = 0.0,
            go_on: Callable[[RunRecord], bool] = lambda record: True) -> RunRecord:
        """Run the script to its end, interrupted as planned; raises :class:`RunFailed`.

        ``go_on`` is asked after each stop whether to start the run again (``False``: the run
        is left there, ``record.finished`` false)."""
        directory = self.scratch / name
        directory.mkdir(mode=0o700)
        root = directory / "checkpoints"
        record = RunRecord(name, Capture(root, directory / "kept",
                                         self._memory_root(root, directory / "work")),
                           directory / "cycle-run.log", directory / "work")
        record.workdir.mkdir(mode=0o700)
        pending = list(interruptions)
        started = time.monotonic()
        with open(record.log, "ab") as log:
            while True:
                record.starts += 1
                code = self._one_start(record, pending, log, count_delay)
                if code == EXIT_SUCCESS:
                    record.finished = True
                    break
                if code == EXIT_USAGE:
                    raise ConfigError(f"cycle run refused the command: {_last_line(record.log)}")
                if code != EXIT_REQUEUE or not record.resumes:
                    raise RunFailed(f"the {name} run's cycle run exited {code} (its output: "
                                    f"{record.log}; it ran in the empty directory "
                                    f"{record.workdir}: give the script's inputs as absolute "
                                    "paths)")
                record.capture.next_segment()
                if not go_on(record):
                    break
        record.seconds = time.monotonic() - started
        return record

    def _one_start(self, record: RunRecord, pending: list[Interruption], log: IO[bytes],
                   count_delay: float) -> int:
        """One ``cycle run`` until it exits; a planned stop ends it, a planned kill does not."""
        command = [*self.cycle_run, "--checkpoint-dir", str(record.capture.root),
                   *self.run_args]
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        guarded = [sys.executable, "-c", _STOPPED_WITH_VERIFY, str(os.getpid()), *command]
        # stdin: /dev/null, never the caller's: the runs must see the same input, and a script
        # that asks (input()) must not wait on a terminal that shows it nothing.
        process = subprocess.Popen(guarded, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=record.workdir,
                                   env={**self.environ, "PWD": str(record.workdir)},
                                   start_new_session=True)
        try:
            return self._watch(process, record, pending, count_delay)
        except BaseException:
            _abort(process)
            raise

    def _watch(self, process: subprocess.Popen[bytes], record: RunRecord,
               pending: list[Interruption], count_delay: float) -> int:
        capture, beacons = record.capture, self._beacons(record)
        stopping, shown, began = False, 0.0, time.monotonic()
        stop_sent = began
        first_seen: dict[int, int] | None = {}  # pid -> its first step; None once one stepped
        while (code := process.poll()) is None:
            capture.poll()
            readings = [r for r in read_beacons(beacons) if pid_alive(r.pid)]
            record.last_step = max([record.last_step, *(r.step for r in readings)])
            if first_seen is not None:
                for reading in readings:
                    if first_seen.setdefault(reading.pid, reading.step) != reading.step:
                        record.startup_seconds += time.monotonic() - began
                        first_seen = None
                        break
            if pending and not stopping and _due(pending[0], record, readings, count_delay):
                stopping = self._interrupt(process, record, pending.pop(0), readings)
                stop_sent = time.monotonic()
            if time.monotonic() - shown > 0.2:
                self.progress(record.name, record.last_step, len(capture.kept))
                shown = time.monotonic()
            time.sleep(POLL_SECONDS)
        capture.poll()
        if stopping:
            record.stopping_seconds += time.monotonic() - stop_sent
        if stopping and record.resumes:
            record.resumes[-1] = _resumed_from(record.resumes[-1], capture)
        return code

    def _memory_dir(self, workdir: Path) -> str | None:
        """The ``--memory-dir`` the user's options name, if any: a relative one is taken from
        the run's working directory, as ``cycle run`` there takes it."""
        memory_dir = _option_value(self.run_args, "--memory-dir")
        return None if memory_dir is None else os.path.join(workdir, memory_dir)

    def _memory_root(self, root: Path, workdir: Path) -> Path:
        """Where ``cycle run`` on ``root`` keeps its memory tier, if the user's options turn it
        on (in the ``--memory-dir`` they name, if any)."""
        return memory_root(memory_base(self._memory_dir(workdir), self.environ), root)

    def _beacons(self, record: RunRecord) -> Path:
        """Where the workers of ``cycle run`` for ``record`` keep their beacons (node 0's
        runtime directory, in the ``--memory-dir`` the user's options name, if any)."""
        directory = runtime_dir(record.capture.root, 0, self._memory_dir(record.workdir),
                                self.environ)
        return NodeFiles.in_directory(directory, 0).progress_dir

    def _interrupt(self, process: subprocess.Popen[bytes], record: RunRecord,
                   planned: Interruption, readings: list[Reading]) -> bool:
        """Send it; True when it is a stop (the process will exit)."""
        resume = Resume(planned, record.last_step, None, None)
        if planned.kind == KILL:
            record.capture.poll()  # the restart resumes from the newest commit: know it
            victim = max(readings, key=lambda r: r.rank)  # not rank 0 (it commits), if others
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim.pid, signal.SIGKILL)
            record.resumes.append(_resumed_from(resume, record.capture))
            record.capture.next_segment()
            return False
        process.send_signal(signal.SIGTERM)
        record.resumes.append(resume)
        return True


def _due(planned: Interruption, record: RunRecord, readings: list[Reading],
         count_delay: float) -> bool:
    if not readings or not record.capture.kept:
        return False  # no worker to kill yet, or nothing committed to resume from
    if planned.step is not None:
        return record.last_step >= planned.step
    kept = record.capture.kept
    return len(kept) >= (planned.after_checkpoints or 1) and \
        time.time() - kept[-1].manifest.created_at >= count_delay


def _resumed_from(resume: Resume, capture: Capture) -> Resume:
    latest = capture.newest()
    return Resume(resume.interruption, resume.sent_at_step,
                  latest.step if latest else None, latest.name if latest else None)


def _abort(process: subprocess.Popen[bytes]) -> None:
    """Stop a run at once (a second SIGINT), then kill it if it does not go."""
    for _ in range(2):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        time.sleep(0.1)
    try:
        process.wait(_ABORT_GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _last_line(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines()
    return lines[-1].removeprefix("cycle: error: ") if lines else "(no output)"


def _option_value(arguments: Sequence[str], name: str) -> str | None:
    """The value of option ``name`` (``--name VALUE`` or ``--name=VALUE``) in ``arguments``."""
    for index, argument in enumerate(arguments):
        if argument == name and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith(f"{name}="):
            return argument.split("=", 1)[1]
    return None
