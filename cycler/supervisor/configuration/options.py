"""``cycle run``'s options: one checked dataclass, filled from flags, a YAML file and the scheduler.

Each option is declared once, as a field of :class:`RunOptions` with its flag, YAML types,
environment variables and help (:func:`.flags.option`); the command line, the config file's keys
and ``docs/options.md`` are derived from these fields.

Precedence, highest first: flags, the ``--config`` file, the scheduler's environment (Slurm or
ISC), the defaults below. Rendezvous settings taken from the environment only apply to multi-node
runs: a single node always uses torchrun's ``--standalone`` rendezvous on a free port, so two
single-node jobs sharing a machine never collide on a port.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cycler.checkpoint.layout import DEFAULT_PREFIX, CheckpointLayout
from cycler.checkpoint.memory_roots import (
    DEFAULT_MEMORY_DIR,
    memory_base,
    memory_root,
    runtime_dir,
)
from cycler.checkpoint.tiers import DEFAULT_PERSIST_EVERY
from cycler.errors import ConfigError
from cycler.protocol.environment import ENV_CHECKPOINT_DIR, ENV_ISC_ARTIFACT_PATH
from cycler.protocol.node_local import NodeFiles
from cycler.protocol.record import RunRecord
from cycler.supervisor.configuration.config_file import read_config_file
from cycler.supervisor.configuration.flags import NUMBER, config_types, option
from cycler.supervisor.nodes.peers import START_TIMEOUT
from cycler.supervisor.schedulers.environment import (
    NNODES_VARIABLES,
    NODE_RANK_VARIABLES,
    NPROC_VARIABLES,
    scheduler_defaults,
)
from cycler.supervisor.schedulers.notices import NOTICE_MODES

DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR2")
# These cannot be caught (KILL, STOP) or already mean something else to the supervisor.
_UNUSABLE_SIGNALS = {"SIGKILL", "SIGSTOP", "SIGCONT", "SIGCHLD"}
NPROC_KEYWORDS = ("auto", "cpu", "gpu", "xpu")
"""torchrun's symbolic ``--nproc-per-node`` values, passed to torchrun as they are."""
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2", "static")
"""The rendezvous backends torchrun ships."""

HANG_LEAST_SECONDS = 1.0
"""The shortest ``--hang-*`` allowance: below it ordinary pauses would count as hangs."""
DIVERGENCE_ACTIONS = ("warn", "stop")
"""What ``--on-divergence`` may say (:mod:`cycler.supervisor.watch.replay_watch`)."""
LAUNCH_MODES = ("script", "module", "no_python", "run_path")
"""How torchrun starts SCRIPT: ``python SCRIPT``, ``python -m SCRIPT`` (``-m``), SCRIPT itself
(``--no-python``), or ``runpy.run_path`` (``--run-path``)."""


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Everything ``cycle run`` needs; every value is checked when the object is made."""

    script: str
    """The training script torchrun starts on every worker, as given (``./run.sh`` must not
    become ``run.sh``, which ``--no-python`` would look up on PATH)."""
    script_args: tuple[str, ...] = ()
    """Arguments passed to the script untouched."""
    nproc_per_node: int | str = option(
        1, "--nproc-per-node", kind=str, yaml=(int, str), env=NPROC_VARIABLES,
        help="Workers on this node, or auto/cpu/gpu/xpu")
    nnodes: int = option(1, "--nnodes", kind=str, yaml=(int, str), env=NNODES_VARIABLES,
                         help="Nodes, or MIN:MAX for an elastic job")
    """Nodes in the job (the most, for an elastic ``MIN:MAX`` range)."""
    min_nodes: int | None = None
    """The fewest nodes of an elastic job (torchrun's ``--nnodes MIN:MAX``); ``None``: fixed."""
    node_rank: int = option(0, "--node-rank", yaml=(int,), env=NODE_RANK_VARIABLES,
                            help="This node's rank")
    master_addr: str | None = option(
        None, "--master-addr", yaml=(str,), env=("MASTER_ADDR",),
        shown="$MASTER_ADDR, first host of $SLURM_JOB_NODELIST",
        help="Node 0's address")
    master_port: int | None = option(
        None, "--master-port", yaml=(int,), env=("MASTER_PORT",),
        shown="$MASTER_PORT, derived from $SLURM_JOB_ID", help="Node 0's port")
    rdzv_endpoint: str | None = option(
        None, "--rdzv-endpoint", yaml=(str,),
        help="host:port of a c10d rendezvous (instead of master)")
    rdzv_backend: str | None = option(None, "--rdzv-backend", yaml=(str,), shown="c10d",
                                      help="Rendezvous backend for --rdzv-endpoint")
    rdzv_id: str | None = option(None, "--rdzv-id", yaml=(str, int),
                                 shown="$SLURM_JOB_ID, cycler",
                                 help="Rendezvous id shared by the job's nodes")
    standalone: bool = option(False, "--standalone", yaml=(bool,), shown="",
                              help="One node, rendezvous on a free port (the default for one "
                                   "node)")
    launch_mode: str = "script"
    """How torchrun starts the script: one of :data:`LAUNCH_MODES` (``-m``, ``--no-python``,
    ``--run-path``)."""
    torchrun_args: tuple[str, ...] = ()
    """torchrun options cycle does not own (``--log-dir``, ``--tee``, ...), passed unchanged."""
    fork_workers: bool = option(
        True, "--fork-workers/--no-fork-workers", yaml=(bool,),
        help="Start each worker by fork from torchrun's agent, which has imported torch "
             "(a script, not -m or --no-python; a number of processes per node)")
    """Saves every worker its own ``import torch`` at each start
    (:mod:`cycler.supervisor.launch.forked`)."""
    checkpoint_dir: Path = option(
        Path("checkpoints"), "--checkpoint-dir", yaml=(str,),
        env=(ENV_CHECKPOINT_DIR, ENV_ISC_ARTIFACT_PATH),
        help="Checkpoint root; the supervisor's record goes to its .cycler/")
    shared_root_group: str | None = option(
        None, "--shared-root-group", yaml=(str,),
        help="A group of yours whose members may own or write the checkpoint root (a root "
             "shared on purpose); without it, a root of another user or open to others' "
             "writes is refused")
    """Whose checkpoint root this job may use: :func:`cycler._private.user_trust`."""
    memory_tier: bool = option(
        False, "--memory-tier/--no-memory-tier", kind=bool, yaml=(bool, str), shown="off",
        help="Commit every checkpoint in node memory first and persist some to the checkpoint "
             "root, on one node or several")
    """Whether checkpoints go to node memory first (a YAML string is a ``memory_dir``)."""
    memory_dir: Path | None = option(
        None, "--memory-dir", yaml=(str,),
        shown=f"$XDG_RUNTIME_DIR where it is private, else {DEFAULT_MEMORY_DIR}",
        help="The tmpfs where --memory-tier keeps them, in a private cycler-UID directory "
             "(implies it)")
    """The tmpfs for the memory tier as given (``None``: not given, then
    ``memory_roots.memory_base`` picks it); a given directory is used as it is, ``/dev/shm``
    included. This job's memory root is in the user's private base inside it
    (``<dir>/cycler-<uid>``)."""
    persist_every: int = option(
        DEFAULT_PERSIST_EVERY, "--persist-every", yaml=(int,),
        help="With --memory-tier: persist every K-th checkpoint (and every stop's)")
    checkpoint_name: str = option(DEFAULT_PREFIX, "--checkpoint-name", yaml=(str,),
                                  help="The saver's name= whose checkpoints cycle watches")
    grace: float = option(60.0, "--grace", yaml=NUMBER,
                          help="Seconds to checkpoint and exit after a stop signal")
    max_restarts: int = option(3, "--max-restarts", yaml=(int,),
                               help="Restarts after worker failures")
    restart_delay: float = option(
        1.0, "--restart-delay", yaml=NUMBER,
        help="Seconds before the first restart, doubling without a new checkpoint")
    node_timeout: float = option(
        30.0, "--node-timeout", yaml=NUMBER,
        help="Seconds another node may go silent before this one gives the job up")
    """Multi-node jobs: this node's workers could never finish a collective without it."""
    start_timeout: float = option(
        START_TIMEOUT, "--start-timeout", yaml=NUMBER,
        help="Seconds another node may stay unheard from the start before the job ends "
             "naming it")
    """Multi-node jobs; torchrun's rendezvous waits a little longer, so this verdict comes
    first."""
    hang_detection: bool = option(
        True, "--hang-detection/--no-hang-detection", yaml=(bool,),
        help="Kill and restart workers that stop making progress")
    """Workers that import cycler only: they publish progress."""
    hang_timeout_min: float = option(
        30.0, "--hang-timeout-min", yaml=NUMBER,
        help="Least seconds without a step that count as a hang")
    hang_factor: float = option(
        5.0, "--hang-factor", yaml=NUMBER,
        help="A hang: no step for max(--hang-timeout-min, this x the longest step)")
    hang_first_step: float = option(
        600.0, "--hang-first-step", yaml=NUMBER,
        help="Seconds allowed before the first step after a start (loading, compilation)")
    hang_pause_timeout: float = option(
        1800.0, "--hang-pause-timeout", yaml=NUMBER,
        help="Seconds allowed while saving or in a marked phase (an evaluation)")
    requeue: bool = option(False, "--requeue/--no-requeue", yaml=(bool,),
                           shown="on under Slurm",
                           help="scontrol requeue $SLURM_JOB_ID after a stop that leaves a "
                                "checkpoint")
    max_requeues: int = option(100, "--max-requeues", yaml=(int,),
                               help="Requeues allowed, against $SLURM_RESTART_COUNT")
    resume_from: str | None = option(
        None, "--resume-from", yaml=(str, int),
        help="Start from this checkpoint (name or index) instead of the latest")
    signals: tuple[str, ...] = option(DEFAULT_SIGNALS, "--signals", yaml=(str, list),
                                      help="Signals that ask for checkpoint and exit")
    preemption_notices: str = option(
        "auto", "--preemption-notices", yaml=(str,),
        help="Poll the cloud's metadata service for preemption notices and stop on one: auto "
             "(the cloud this machine's identity names, nothing elsewhere), aws, gcp, azure "
             "or off")
    metadata_endpoint: str | None = option(None, "--metadata-endpoint", yaml=(str,),
                                           shown="the cloud's",
                                           help="Base URL of the metadata service")
    on_divergence: str = option(
        "warn", "--on-divergence", yaml=(str,),
        help="A restart's replayed steps differ from the earlier run's: warn, or stop "
             "(exit 65)")
    resumable_if: str | None = option(
        None, "--resumable-if", yaml=(str,),
        help="Glob of the script's own checkpoints: after a stop with none of cycler's, one "
             "written since the job began means exit 75 (HF checkpoint-N, Lightning .ckpt, "
             "Accelerate step_N/epoch_N and whole torch.save files are recognised)")
    """Relative globs are read from the directory ``cycle run`` started in."""
    slurm_job_id: str | None = None
    """``SLURM_JOB_ID`` when running under Slurm."""
    requeue_count: int = 0
    """``SLURM_RESTART_COUNT``: how often this job was requeued already."""

    @functools.cached_property
    def layout(self) -> CheckpointLayout:
        """The checkpoint root's layout for the watched saver, built once per options."""
        return CheckpointLayout(self.checkpoint_dir, self.checkpoint_name)

    @functools.cached_property
    def record(self) -> RunRecord:
        """The checkpoint root's record (``.cycler/``), built once per options."""
        return RunRecord(self.checkpoint_dir)

    @functools.cached_property
    def memory_layout(self) -> CheckpointLayout | None:
        """This job's memory root on this node (with ``--memory-tier``)."""
        if not self.memory_tier:
            return None
        return CheckpointLayout(memory_root(memory_base(self.memory_dir), self.layout.root),
                                self.checkpoint_name)

    @functools.cached_property
    def runtime_dir(self) -> Path:
        """This job's private directory on this node: the files its ranks and supervisor
        exchange while training (:mod:`cycler.protocol.node_local`)."""
        return runtime_dir(self.layout.root, self.node_rank, self.memory_dir)

    @property
    def node_files(self) -> NodeFiles:
        """The control file the workers poll, their beacons and the commit note, on the node."""
        return NodeFiles.in_directory(self.runtime_dir, self.node_rank)

    def __post_init__(self) -> None:
        self._normalise()
        self._check_processes()
        self._check_times()
        self._check_rendezvous()
        _require(self.preemption_notices in NOTICE_MODES, "preemption_notices",
                 f"must be one of {', '.join(NOTICE_MODES)}")
        _require(self.on_divergence in DIVERGENCE_ACTIONS, "on_divergence",
                 f"must be one of {', '.join(DIVERGENCE_ACTIONS)}")
        _require(self.metadata_endpoint is None or _is_url(self.metadata_endpoint),
                 "metadata_endpoint", "must be an http:// or https:// URL with a host (and a "
                 "numeric port if any), such as http://169.254.169.254")
        name = self.checkpoint_name
        _require(bool(name) and "/" not in name and not name.startswith("."), "checkpoint_name",
                 "must be a plain file name such as AtomicDirectory")

    def _normalise(self) -> None:
        """The values as the rest of cycle uses them: paths, tuples, signal names, counts."""
        for name, example in (("checkpoint_dir", "./checkpoints"),
                              ("memory_dir", str(DEFAULT_MEMORY_DIR)),
                              ("resumable_if", "'output/checkpoint-*'")):
            # Path("") is Path("."): an empty value would quietly mean the current directory.
            _require(getattr(self, name) is None or bool(str(getattr(self, name)).strip()), name,
                     f"is empty: give a value such as {example}, or leave it out")
        object.__setattr__(self, "checkpoint_dir", Path(self.checkpoint_dir))
        if self.memory_dir is not None:
            object.__setattr__(self, "memory_dir", Path(self.memory_dir))
        object.__setattr__(self, "signals", parse_signals(self.signals))
        object.__setattr__(self, "script", os.fspath(self.script))
        object.__setattr__(self, "script_args", tuple(self.script_args))
        object.__setattr__(self, "torchrun_args", tuple(self.torchrun_args))
        object.__setattr__(self, "nproc_per_node", parse_nproc(self.nproc_per_node))

    def _check_processes(self) -> None:
        _require(not isinstance(self.persist_every, bool) and self.persist_every >= 1,
                 "persist_every", "must be a whole number, 1 or more (such as 5)")
        _require(self.nnodes >= 1, "nnodes", "must be at least 1")
        _require(self.min_nodes is None or 1 <= self.min_nodes <= self.nnodes, "nnodes",
                 "must be N or MIN:MAX with 1 <= MIN <= MAX")
        _require(self.launch_mode in LAUNCH_MODES, "launch_mode",
                 f"must be one of {', '.join(LAUNCH_MODES)}")
        _require(not (self.standalone and self.nnodes > 1), "standalone",
                 "runs one node: drop --standalone or --nnodes")
        for name in ("max_restarts", "max_requeues", "requeue_count"):
            _require(getattr(self, name) >= 0, name, "must be 0 or more")
        _require(0 <= self.node_rank < self.nnodes, "node_rank",
                 f"must be between 0 and nnodes - 1 ({self.nnodes - 1})")

    def _check_times(self) -> None:
        # math.isfinite also refuses nan; inf would overflow the deadline arithmetic.
        _require(math.isfinite(self.grace) and self.grace > 0, "grace",
                 "must be a finite number of seconds above 0 (such as 60)")
        _require(math.isfinite(self.node_timeout) and self.node_timeout >= 2, "node_timeout",
                 "must be a finite number of seconds, 2 or more (heartbeats come every second)")
        _require(math.isfinite(self.start_timeout) and self.start_timeout > 0, "start_timeout",
                 "must be a finite number of seconds above 0 (such as 600)")
        _require(math.isfinite(self.restart_delay) and self.restart_delay >= 0,
                 "restart_delay", "must be a finite number of seconds, 0 or more")
        for name, example in (("hang_timeout_min", 30), ("hang_first_step", 600),
                              ("hang_pause_timeout", 1800)):
            # Below a second an ordinary pause (a collection, an fsync, a busy host) is a hang:
            # 0 never meant "off", it killed healthy workers.
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= HANG_LEAST_SECONDS, name,
                     f"must be at least {HANG_LEAST_SECONDS:g} second (such as {example}); to "
                     "turn hang detection off give --no-hang-detection")
        _require(math.isfinite(self.hang_factor) and self.hang_factor >= 1, "hang_factor",
                 "must be a finite number, 1 or more (such as 5)")

    def _check_rendezvous(self) -> None:
        port = self.master_port
        _require(port is None or 0 < port < 65536, "master_port", "must be between 1 and 65535")
        _require(self.rdzv_backend in (None, *RDZV_BACKENDS), "rdzv_backend",
                 f"must be one of {', '.join(RDZV_BACKENDS)}")
        _require(self.rdzv_endpoint is None or self.master_addr is None, "rdzv_endpoint",
                 "cannot be combined with master_addr; give one of them")
        _require(self.nnodes == 1 or bool(self.master_addr or self.rdzv_endpoint), "master_addr",
                 "is needed when nnodes > 1: give --master-addr (node 0's host) or "
                 "--rdzv-endpoint")


def _is_url(text: str) -> bool:
    """Whether ``text`` is an http(s) URL with a host and, if it names one, a numeric port."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and bool(parts.hostname)
            and not any(character.isspace() for character in text))


def _require(condition: bool, name: str, fix: str) -> None:
    if not condition:
        raise ConfigError(f"{name.replace('_', '-')} {fix}")


def parse_nproc(value: int | str) -> int | str:
    """``--nproc-per-node`` as torchrun takes it: a count of at least 1, or a keyword."""
    text = str(value).strip().lower()
    if text in NPROC_KEYWORDS:
        return text
    try:
        count = int(text)
    except ValueError:
        count = 0
    if isinstance(value, bool) or count < 1:
        raise ConfigError(f"nproc-per-node must be a number of at least 1 or one of "
                          f"{', '.join(NPROC_KEYWORDS)}, not {value!r}")
    return count


def parse_nnodes(value: int | str) -> tuple[int | None, int]:
    """torchrun's ``--nnodes``: ``N`` (fixed) or ``MIN:MAX`` (elastic) as ``(min or None, max)``."""
    low, colon, high = str(value).partition(":")
    try:
        bounds = (int(low), int(high)) if colon else (None, int(low))
    except ValueError:
        raise ConfigError(f"nnodes must be N or MIN:MAX (whole numbers), not {value!r}") from None
    return bounds


def parse_signals(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"TERM,int"`` or ``["SIGTERM", "INT"]`` as canonical names; ConfigError if unusable."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = []
    for item in items:
        name = str(item).strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        if name not in signal.Signals.__members__ or name in _UNUSABLE_SIGNALS:
            raise ConfigError(f"signals: {item!r} is not a signal the supervisor can use; "
                              f"give names like {','.join(DEFAULT_SIGNALS)}")
        if name not in names:
            names.append(name)
    if not names:
        raise ConfigError("signals must name at least one signal, e.g. SIGTERM")
    return tuple(names)


# --- the configuration file -------------------------------------------------------------------

CONFIG_KEYS = tuple(sorted(config_types(RunOptions)))
"""Keys a ``--config`` file may set (dashes and underscores are both accepted)."""


def load_config_file(path: Path) -> dict[str, Any]:
    """The options a YAML ``--config`` file sets, keys normalised to underscores;
    :class:`ConfigError` naming the file and key if one is unknown or of the wrong type."""
    return read_config_file(path, config_types(RunOptions))


# --- putting it together ----------------------------------------------------------------------


def resolve_run_options(*, script: str | Path, script_args: Sequence[str] = (),
                        flags: Mapping[str, Any] | None = None, config_file: Path | None = None,
                        environ: Mapping[str, str] | None = None) -> RunOptions:
    """RunOptions from flags (``None`` values: not given), a config file and the environment."""
    general, rendezvous = scheduler_defaults(environ or {})
    from_file = load_config_file(config_file) if config_file is not None else {}
    given = {key: value for key, value in (flags or {}).items() if value is not None}
    _check_flag_names(given)
    merged = {**general, **from_file, **given}
    if merged.get("standalone"):
        for key in ("nnodes", "node_rank"):  # one node, whatever the scheduler's variables say
            if key not in {**from_file, **given}:
                merged.pop(key, None)
    if "nnodes" in merged:
        merged["min_nodes"], merged["nnodes"] = parse_nnodes(merged["nnodes"])
    if merged.get("nnodes", 1) > 1 and merged.get("rdzv_endpoint") is None:
        merged = {**rendezvous, **merged}
    if "signals" in merged:
        merged["signals"] = parse_signals(merged["signals"])
    if merged.get("resume_from") is not None:
        merged["resume_from"] = str(merged["resume_from"])
    if isinstance(merged.get("memory_tier"), str):  # YAML's memory_tier: /mnt/ram
        _require(bool(merged["memory_tier"].strip()), "memory_tier",
                 f"is empty: give a value such as {DEFAULT_MEMORY_DIR}, or leave it out")
        merged["memory_dir"] = merged.get("memory_dir") or merged["memory_tier"]
        merged["memory_tier"] = True
    if merged.get("memory_dir") is not None and merged.get("memory_tier") is not False:
        merged["memory_tier"] = True  # --memory-dir implies --memory-tier
    return RunOptions(script=os.fspath(script), script_args=tuple(script_args), **merged)


def _check_flag_names(given: Mapping[str, Any]) -> None:
    known = {field.name for field in fields(RunOptions)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(f"unknown run options: {', '.join(unknown)}")
