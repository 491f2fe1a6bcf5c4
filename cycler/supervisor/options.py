"""``cycle run``'s options: one checked dataclass, filled from flags, a YAML file and the scheduler.

Precedence, highest first: flags, the ``--config`` file, the scheduler's environment (Slurm or
ISC), the defaults below. Rendezvous settings taken from the environment only apply to multi-node
runs: a single node always uses torchrun's ``--standalone`` rendezvous on a free port, so two
single-node jobs sharing a machine never collide on a port.
"""

from __future__ import annotations

import functools
import math
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cycler.checkpoint.layout import DEFAULT_PREFIX, CheckpointLayout
from cycler.checkpoint.memory_roots import DEFAULT_MEMORY_DIR, memory_base, memory_root
from cycler.checkpoint.tiers import DEFAULT_PERSIST_EVERY
from cycler.errors import ConfigError
from cycler.protocol.environment import default_checkpoint_root
from cycler.supervisor.notices import NOTICE_MODES
from cycler.supervisor.peers import START_TIMEOUT

DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR2")
# These cannot be caught (KILL, STOP) or already mean something else to the supervisor.
_UNUSABLE_SIGNALS = {"SIGKILL", "SIGSTOP", "SIGCONT", "SIGCHLD"}
_DEFAULT_MASTER_PORT_BASE = 20000
NPROC_KEYWORDS = ("auto", "cpu", "gpu", "xpu")
"""torchrun's symbolic ``--nproc-per-node`` values, passed to torchrun as they are."""
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
    nproc_per_node: int | str = 1
    """Worker processes on this node, or one of torchrun's ``auto``, ``cpu``, ``gpu``, ``xpu``."""
    nnodes: int = 1
    """Nodes in the job (the most, for an elastic ``MIN:MAX`` range)."""
    min_nodes: int | None = None
    """The fewest nodes of an elastic job (torchrun's ``--nnodes MIN:MAX``); ``None``: fixed."""
    node_rank: int = 0
    """This node's rank, ``0 <= node_rank < nnodes``."""
    master_addr: str | None = None
    """Address of node 0 for torchrun's static rendezvous (``None``: standalone on one node)."""
    master_port: int | None = None
    """Port of node 0 for the static rendezvous."""
    rdzv_endpoint: str | None = None
    """``host:port`` of a c10d rendezvous, instead of ``master_addr``/``master_port``."""
    rdzv_backend: str | None = None
    """torchrun's rendezvous backend for ``rdzv_endpoint`` (``None``: c10d)."""
    rdzv_id: str | None = None
    """The rendezvous id every node of the job shares (``None``: the Slurm job id, else cycler)."""
    standalone: bool = False
    """torchrun's ``--standalone``: one node, a rendezvous on a free port (the one-node default)."""
    launch_mode: str = "script"
    """How torchrun starts the script: one of :data:`LAUNCH_MODES`."""
    torchrun_args: tuple[str, ...] = ()
    """torchrun options cycle does not own (``--log-dir``, ``--tee``, ...), passed unchanged."""
    checkpoint_dir: Path = Path("checkpoints")
    """The checkpoint root; the supervisor's record goes to its ``.cycler/``."""
    memory_tier: Path | None = None
    """The tmpfs where jobs keep checkpoints in node memory (``--memory-tier``; ``None``: no
    memory tier). This job's memory root is in the user's private base inside it
    (``memory_roots.memory_base``: ``<dir>/cycler-<uid>``)."""
    persist_every: int = DEFAULT_PERSIST_EVERY
    """With the memory tier: persist every checkpoint whose index is a multiple of this."""
    checkpoint_name: str = DEFAULT_PREFIX
    """The saver's name (``AtomicDirectory(name=...)``) whose checkpoints the supervisor watches."""
    grace: float = 60.0
    """Seconds workers get to checkpoint and exit after a stop signal."""
    max_restarts: int = 3
    """How often failed workers are restarted before the job fails."""
    restart_delay: float = 1.0
    """Seconds before the first restart; doubled after each failure without a new checkpoint."""
    node_timeout: float = 30.0
    """Seconds another node's supervisor may stay silent before this node gives the job up
    (multi-node jobs; its workers could never finish a collective without that node)."""
    start_timeout: float = START_TIMEOUT
    """Seconds another node may stay unheard from the start before the job ends naming it
    (multi-node jobs; torchrun's rendezvous waits a little longer, so this verdict comes
    first)."""
    hang_detection: bool = True
    """Kill and restart the workers when none of this node's makes progress for too long
    (workers that import cycler only: they publish progress)."""
    hang_timeout_min: float = 30.0
    """The least a step may take before it counts as a hang (seconds)."""
    hang_factor: float = 5.0
    """A hang is no progress for ``max(hang_timeout_min, hang_factor x the longest step)``."""
    hang_first_step: float = 600.0
    """Seconds allowed before the first step after a start (loading, compilation)."""
    hang_pause_timeout: float = 1800.0
    """Seconds allowed while a worker saves or is in a phase it marked (an evaluation)."""
    requeue: bool = False
    """Run ``scontrol requeue $SLURM_JOB_ID`` after a stop that leaves a checkpoint."""
    max_requeues: int = 100
    """Requeues allowed in the job's life, counted by ``SLURM_RESTART_COUNT``."""
    resume_from: str | None = None
    """Checkpoint (name or index) the first start resumes from, instead of the latest."""
    signals: tuple[str, ...] = DEFAULT_SIGNALS
    """Signals that ask the workers to checkpoint and exit."""
    preemption_notices: str = "auto"
    """Which cloud's metadata service to poll for preemption notices: ``auto`` (the cloud
    this machine's DMI identity names, none elsewhere), ``aws``, ``gcp``, ``azure`` or ``off``."""
    metadata_endpoint: str | None = None
    """The metadata service's base URL (``None``: the cloud's own)."""
    slurm_job_id: str | None = None
    """``SLURM_JOB_ID`` when running under Slurm."""
    requeue_count: int = 0
    """``SLURM_RESTART_COUNT``: how often this job was requeued already."""

    @functools.cached_property
    def layout(self) -> CheckpointLayout:
        """The checkpoint root's layout for the watched saver, built once per options."""
        return CheckpointLayout(self.checkpoint_dir, self.checkpoint_name)

    @functools.cached_property
    def memory_layout(self) -> CheckpointLayout | None:
        """This job's memory root on this node (with ``--memory-tier``)."""
        if self.memory_tier is None:
            return None
        given = None if self.memory_tier == DEFAULT_MEMORY_DIR else self.memory_tier
        return CheckpointLayout(memory_root(memory_base(given), self.layout.root),
                                self.checkpoint_name)

    def __post_init__(self) -> None:
        object.__setattr__(self, "signals", parse_signals(self.signals))
        object.__setattr__(self, "script", os.fspath(self.script))
        object.__setattr__(self, "checkpoint_dir", Path(self.checkpoint_dir))
        if self.memory_tier is not None:
            object.__setattr__(self, "memory_tier", Path(self.memory_tier))
        _require(not isinstance(self.persist_every, bool) and self.persist_every >= 1,
                 "persist_every", "must be a whole number, 1 or more (such as 5)")
        object.__setattr__(self, "script_args", tuple(self.script_args))
        object.__setattr__(self, "torchrun_args", tuple(self.torchrun_args))
        object.__setattr__(self, "nproc_per_node", parse_nproc(self.nproc_per_node))
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
        # math.isfinite also refuses nan; inf would overflow the deadline arithmetic.
        _require(math.isfinite(self.grace) and self.grace > 0, "grace",
                 "must be a finite number of seconds above 0 (such as 60)")
        _require(math.isfinite(self.node_timeout) and self.node_timeout >= 2, "node_timeout",
                 "must be a finite number of seconds, 2 or more (heartbeats come every second)")
        _require(math.isfinite(self.start_timeout) and self.start_timeout > 0, "start_timeout",
                 "must be a finite number of seconds above 0 (such as 600)")
        _require(math.isfinite(self.restart_delay) and self.restart_delay >= 0,
                 "restart_delay", "must be a finite number of seconds, 0 or more")
        for name in ("hang_timeout_min", "hang_first_step", "hang_pause_timeout"):
            _require(math.isfinite(getattr(self, name)) and getattr(self, name) >= 0, name,
                     "must be a finite number of seconds, 0 or more")
        _require(math.isfinite(self.hang_factor) and self.hang_factor >= 1, "hang_factor",
                 "must be a finite number, 1 or more (such as 5)")
        port = self.master_port
        _require(port is None or 0 < port < 65536, "master_port", "must be between 1 and 65535")
        _require(self.rdzv_backend in (None, *RDZV_BACKENDS), "rdzv_backend",
                 f"must be one of {', '.join(RDZV_BACKENDS)}")
        _require(self.rdzv_endpoint is None or self.master_addr is None, "rdzv_endpoint",
                 "cannot be combined with master_addr; give one of them")
        _require(self.nnodes == 1 or bool(self.master_addr or self.rdzv_endpoint), "master_addr",
                 "is needed when nnodes > 1: give --master-addr (node 0's host) or "
                 "--rdzv-endpoint")
        _require(self.preemption_notices in NOTICE_MODES, "preemption_notices",
                 f"must be one of {', '.join(NOTICE_MODES)}")
        _require(self.metadata_endpoint is None
                 or self.metadata_endpoint.startswith(("http://", "https://")),
                 "metadata_endpoint", "must be an http:// or https:// URL")
        name = self.checkpoint_name
        _require(bool(name) and "/" not in name and not name.startswith("."), "checkpoint_name",
                 "must be a plain file name such as AtomicDirectory")


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

RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2", "static")
"""The rendezvous backends torchrun ships."""

_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "nproc_per_node": (int, str), "nnodes": (int, str), "node_rank": (int,),
    "master_addr": (str,), "master_port": (int,), "rdzv_endpoint": (str,),
    "rdzv_backend": (str,), "rdzv_id": (str, int), "standalone": (bool,), "checkpoint_dir": (str,),
    "checkpoint_name": (str,), "memory_tier": (str, bool), "persist_every": (int,),
    "grace": (int, float), "max_restarts": (int,),
    "restart_delay": (int, float), "node_timeout": (int, float), "start_timeout": (int, float),
    "requeue": (bool,),
    "hang_detection": (bool,), "hang_timeout_min": (int, float), "hang_factor": (int, float),
    "hang_first_step": (int, float), "hang_pause_timeout": (int, float),
    "max_requeues": (int,),
    "resume_from": (str, int), "signals": (str, list), "preemption_notices": (str,),
    "metadata_endpoint": (str,),
}
CONFIG_KEYS = tuple(sorted(_CONFIG_TYPES))
"""Keys a ``--config`` file may set (dashes and underscores are both accepted)."""


def load_config_file(path: Path) -> dict[str, Any]:
    """The options set in a YAML file, keys normalised to underscores; ConfigError if invalid."""
    import yaml  # only runs with --config: every start of cycle run would pay for it

    try:
        loaded = yaml.load(Path(path).read_text(), Loader=_yaml12_loader())
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not text (binary?); give a YAML file of "
                          "option: value lines") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {_one_line(error)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must be a mapping of option: value")
    options = {}
    for key, value in loaded.items():
        name = _config_key(path, key)
        options[name] = _checked_value(path, name, value)
    return options


def _yaml12_loader() -> type:
    """PyYAML's safe loader with YAML 1.2's integers: ``1:2`` and ``010`` stay strings (YAML
    1.1 reads them as sexagesimal 62 and octal 8, which no one writing ``nnodes: 1:2`` or
    ``resume_from: 010`` means)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(0|[1-9][0-9]*)$"),
                                 list("-+0123456789"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"
                   r"|^[-+]?[0-9]+[eE][-+]?[0-9]+$"
                   r"|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"), list("-+0123456789."))
    return Loader


def _config_key(path: Path, key: object) -> str:
    name = str(key).replace("-", "_")
    if name not in _CONFIG_TYPES:
        raise ConfigError(f"config file {path}: unknown key {key!r}; known keys: "
                          f"{', '.join(CONFIG_KEYS)}")
    return name


def _checked_value(path: Path, key: str, value: object) -> object:
    allowed = _CONFIG_TYPES[key]
    # bool is an int in Python, but ``grace: true`` is a mistake, not one second.
    if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
        wanted = " or ".join(kind.__name__ for kind in allowed)
        raise ConfigError(f"config file {path}: {key} must be {wanted}, not "
                          f"{type(value).__name__} ({value!r})")
    if key in ("resume_from", "rdzv_id"):
        return str(value)
    return value


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


# --- the scheduler's environment --------------------------------------------------------------


_RANGES = r"\[\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\]"
_HOST = rf"(?:[^,\[\]]+|{_RANGES})+"
_NODELIST = re.compile(rf"{_HOST}(?:,{_HOST})*")
"""Slurm's host list: names with bracketed numeric ranges, separated by commas."""


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list (``node[01-03,07],gpu1``) as host names, in order;
    :class:`ConfigError` naming the variable if it is not one."""
    hosts: list[str] = []
    if _NODELIST.fullmatch(nodelist):
        for part in re.findall(r"(?:[^,\[]+|\[[^\]]*\])+", nodelist):
            hosts.extend(_expand_host(part))
    if not hosts:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r} is not a Slurm host list (such as "
                          "node[01-03],gpu1); fix it, or give --master-addr")
    return hosts


def _expand_host(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end():]
    return [head + item + rest for item in _expand_ranges(match.group(1))
            for rest in _expand_host(tail)]


def _expand_ranges(ranges: str) -> list[str]:
    items = []
    for piece in ranges.split(","):
        low, _, high = piece.partition("-")
        if not high:
            items.append(low)
            continue
        width = len(low)  # node[01-03] keeps its leading zeros
        items.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return items


def scheduler_defaults(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Defaults from Slurm/ISC variables: (always applied, applied only to multi-node runs)."""
    general: dict[str, Any] = {"checkpoint_dir": str(default_checkpoint_root(environ))}
    _set_int(general, "nnodes", environ, "NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    _set_int(general, "nproc_per_node", environ, "N_PROC", "SLURM_GPUS_ON_NODE")
    _set_int(general, "node_rank", environ, "NODE_RANK", "SLURM_NODEID")
    if "node_rank" not in general and environ.get("NNODES") and not environ.get("LOCAL_RANK"):
        # ISC's launch commands pass `--node_rank=$RANK`: there RANK is the node's rank. Inside
        # a torchrun worker (LOCAL_RANK set) RANK is a process rank, so it is not used there.
        _set_int(general, "node_rank", environ, "RANK")
    if environ.get("SLURM_JOB_ID"):
        general["slurm_job_id"] = environ["SLURM_JOB_ID"]
        general["requeue"] = True
        _set_int(general, "requeue_count", environ, "SLURM_RESTART_COUNT")
    return general, _rendezvous_defaults(environ)


def _rendezvous_defaults(environ: Mapping[str, str]) -> dict[str, Any]:
    rendezvous: dict[str, Any] = {}
    if environ.get("MASTER_ADDR"):
        rendezvous["master_addr"] = environ["MASTER_ADDR"]
    elif environ.get("SLURM_JOB_NODELIST"):
        rendezvous["master_addr"] = expand_nodelist(environ["SLURM_JOB_NODELIST"])[0]
    _set_int(rendezvous, "master_port", environ, "MASTER_PORT")
    job_id = environ.get("SLURM_JOB_ID", "")
    if "master_port" not in rendezvous and job_id.isdigit():
        # Every node derives the same port from the job id; jobs sharing a host rarely collide.
        rendezvous["master_port"] = _DEFAULT_MASTER_PORT_BASE + int(job_id) % 20000
    return rendezvous


def _set_int(target: dict[str, Any], key: str, environ: Mapping[str, str], *names: str) -> None:
    for name in names:
        text = environ.get(name)
        if not text:
            continue
        try:
            target[key] = int(text.split("(")[0])  # SLURM_* may read like "2(x3)"
        except ValueError:
            raise ConfigError(f"environment variable {name}={text!r} is not a whole number; "
                              "fix or unset it") from None
        return


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
    if isinstance(merged.get("memory_tier"), bool):  # --memory-tier, or YAML's true / false
        merged["memory_tier"] = DEFAULT_MEMORY_DIR if merged["memory_tier"] else None
    return RunOptions(script=os.fspath(script), script_args=tuple(script_args), **merged)


def _check_flag_names(given: Mapping[str, Any]) -> None:
    known = {field.name for field in fields(RunOptions)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(f"unknown run options: {', '.join(unknown)}")
