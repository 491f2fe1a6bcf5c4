"""A real one-node Slurm (Debian's slurmctld, slurmd, munge) on 127.0.0.1, private to a session.

Everything lives under one directory: the config rendered from ``slurm.conf.in`` (and
``cgroup.conf``), a munge key and socket, the daemons' state, spool, logs and pid files. Clients
find the config through ``$SLURM_CONF``; the ports are free ones picked at start, so nothing in
``/etc`` is touched and a Slurm already on the machine is left alone. Daemons are stopped by the
pids in their pid files, never by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
BINARIES = ("slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "munged", "munge")
STOP_TIMEOUT = 20.0


class SlurmUnavailable(Exception):
    """Slurm cannot run here; the message says why, in a few words."""


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def cgroup_v1_freezer_problem() -> str | None:
    """Why proctrack/cgroup (cgroup v1 freezer) cannot work here, or None if it can."""
    mounts = Path("/proc/mounts").read_text().split("\n")
    if not any(" /sys/fs/cgroup/freezer cgroup " in line for line in mounts):
        return "no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer"
    probe = Path(f"/sys/fs/cgroup/freezer/cycler-slurm-probe.{os.getpid()}")
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        return f"cannot create a cgroup in /sys/fs/cgroup/freezer: {error}"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class SlurmHost:
    """Where one slurmd runs: its node name, address, and the prefix that runs a command there
    (``ip netns exec NS`` for a simulated host, nothing for this machine)."""

    name: str
    address: str
    prefix: tuple[str, ...] = field(default=())


class LocalSlurm:
    """The daemons of one cluster under ``base``; :meth:`start` then :meth:`stop`.

    By default one node on 127.0.0.1, named after this machine. With ``hosts``, one slurmd per
    host, each at its address, and slurmctld on the first host's address (clients run there
    too, as on a login node)."""

    def __init__(self, base: Path, proctrack: str, hosts: list[SlurmHost] | None = None) -> None:
        self.base = base
        self.proctrack = proctrack
        self.conf = base / "etc" / "slurm.conf"
        self.munge_socket = base / "munge-socket" / "munge.sock"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.hosts = hosts or []
        self.node = self.hosts[0].name if self.hosts else ""

    def start(self) -> None:
        """Start munged, slurmctld and slurmd and wait for the node; SlurmUnavailable if not."""
        for sub in ("etc", "state", "spool", "log", "run", "munge", "munge-socket"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        # munged insists that every directory above its socket be searchable by everyone.
        for directory in (self.base, self.munge_socket.parent):
            directory.chmod(0o755)
        self._start_munged()
        self._write_config()
        self._start_daemon("slurmctld", [*self.hosts[0].prefix, "slurmctld"])
        for host in self.hosts:
            self._start_daemon(f"slurmd-{host.name}", [*host.prefix, "slurmd", "-N", host.name])
        for host in self.hosts:
            self._wait_for_node(host.name)

    def _start_munged(self) -> None:
        key = self.base / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge = self.base / "munge"
        self._run_or_fail(["munged", f"--key-file={key}", f"--socket={self.munge_socket}",
                           f"--pid-file={munge / 'munged.pid'}",
                           f"--log-file={munge / 'munged.log'}",
                           f"--seed-file={munge / 'munged.seed'}"], "munged",
                          munge / "munged.log")

    def _write_config(self) -> None:
        hardware = subprocess.run(["slurmd", "-C"], capture_output=True, text=True,
                                  check=False).stdout.splitlines()
        node_line = next((line for line in hardware if line.startswith("NodeName=")), "")
        if not node_line:
            raise SlurmUnavailable("`slurmd -C` printed no NodeName line")
        # UpTime=... is on the next line; the first one is the node's hardware, as slurm.conf
        # wants it.
        name, hardware = node_line.split(maxsplit=1)
        if not self.hosts:
            self.hosts = [SlurmHost(name.removeprefix("NodeName="), "127.0.0.1")]
            self.node = self.hosts[0].name
        nodes = "\n".join(f"NodeName={host.name} NodeAddr={host.address} {hardware}"
                           for host in self.hosts)
        values = {"BASE": str(self.base), "CTLD_PORT": str(free_port()),
                  "SLURMD_PORT": str(free_port()), "MUNGE_SOCKET": str(self.munge_socket),
                  "PROCTRACK": self.proctrack, "NODES": nodes,
                  "CTLD_ADDRESS": self.hosts[0].address}
        text = (HERE / "slurm.conf.in").read_text()
        for name, value in values.items():
            text = text.replace(f"@{name}@", value)
        self.conf.write_text(text)
        shutil.copy(HERE / "cgroup.conf", self.conf.parent / "cgroup.conf")

    def _start_daemon(self, name: str, command: list[str]) -> None:
        self._run_or_fail(command, name, self.base / "log" / f"{name}.log")
        deadline = time.monotonic() + 10
        while self._pid(name) is None:
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"{name} did not start: {self._tail(name)}")
            time.sleep(0.1)

    def _run_or_fail(self, command: list[str], name: str, log: Path) -> None:
        done = subprocess.run(command, capture_output=True, text=True, env=self.env, check=False)
        if done.returncode != 0:
            detail = " ".join((done.stdout + done.stderr).split()) or _tail_of(log)
            raise SlurmUnavailable(f"{name} failed to start: {detail[-400:]}")

    def _wait_for_node(self, node: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.node_state(node) not in ("idle", "mixed", "allocated"):
            if time.monotonic() > deadline:
                raise SlurmUnavailable(
                    f"node {node} not usable after {timeout:g} s (state "
                    f"{self.node_state(node)!r}): {self._tail(f'slurmd-{node}')}")
            time.sleep(0.3)

    def node_state(self, node: str = "") -> str:
        """A node's state in its first partition (sinfo prints one line per partition)."""
        states = self.run(["sinfo", "-h", "-N", "-n", node or self.node, "-o", "%T"]).split()
        return states[0] if states else ""

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged by their pid files."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._cancel_everything()
        for name in (*(f"slurmd-{host.name}" for host in self.hosts), "slurmctld", "munged"):
            self._terminate(name)

    def _cancel_everything(self, timeout: float = 60.0) -> None:
        # A job whose stop requeues itself would come back after a plain scancel: hold first.
        deadline = time.monotonic() + timeout
        while (ids := self.run(["squeue", "-h", "-o", "%i"]).split()) and \
                time.monotonic() < deadline:
            for job_id in ids:
                self.run(["scontrol", "requeuehold", job_id])
                self.run(["scancel", job_id])
            time.sleep(1.0)

    def _terminate(self, name: str) -> None:
        pid = self._pid(name)
        if pid is None:
            return
        process = psutil.Process(pid)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except psutil.TimeoutExpired:
            process.kill()

    def _pid(self, name: str) -> int | None:
        """The live pid in ``name``'s pid file, if its command is ``name``."""
        directory = self.base / ("munge" if name == "munged" else "run")
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            pid = int((directory / f"{name}.pid").read_text().strip())
            if psutil.Process(pid).name() == name.split("-")[0]:
                return pid
        return None

    def run(self, command: list[str], check: bool = False, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> str:
        """A client command's stdout; with ``check``, an AssertionError if it fails."""
        done = subprocess.run([*self.hosts[0].prefix, *command], capture_output=True, text=True,
                              env=env or self.env, cwd=cwd, timeout=60, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {done.returncode}: "
                                 f"{done.stdout}{done.stderr}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, Restarts, ExitCode, ...)."""
        words = self.run(["scontrol", "show", "job", "-o", job_id]).split()
        return dict(word.split("=", 1) for word in words if "=" in word)

    def _tail(self, name: str) -> str:
        return _tail_of(self.base / "log" / f"{name}.log")


def _tail_of(log: Path, lines: int = 5) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:])
    return f"(no {log.name})"
