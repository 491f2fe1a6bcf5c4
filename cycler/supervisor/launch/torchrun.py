"""The torchrun command line and the environment every worker gets from ``cycle run``.

On one node torchrun is told never to restart workers itself (``--max-restarts 0``): restarts,
backoff and crash-loop detection belong to the supervisor, which also knows about checkpoints.
With several nodes a restart must bring every node's workers back together, which is what
torchrun's c10d rendezvous and its agent's restart and membership logic do: the agent restarts
its workers when they fail *and* when another node's agent re-joins the rendezvous, so a node
whose workers hang in a collective is restarted too instead of waiting for the collective's
timeout. There torchrun restarts, and the launcher (:mod:`.launcher`) applies cycle's restart
budget to each of its restarts. torchrun's own
shutdown timeout is raised above the grace, so that if the scheduler signals torchrun directly,
torchrun's SIGKILL of the workers never comes before the grace the supervisor promised them.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cycler.protocol.environment import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_NAME,
    ENV_CONTROL_FILE,
    ENV_ISC_ARTIFACT_PATH,
    ENV_ISC_LOSSY_PATH,
    ENV_MEMORY_TIER,
    ENV_NODE_DIR,
    ENV_PERSIST_EVERY,
    ENV_PROGRESS_DIR,
    ENV_RESTART_COUNT,
    ENV_RESUME_FROM,
    ENV_STOP_SIGNALS,
)
from cycler.supervisor.compile_cache.place import compile_cache_environment
from cycler.supervisor.configuration.options import RunOptions
from cycler.supervisor.launch.script_source import environment_writes, read_source

# torch >= 2.10 reads the first; PET_* is torchrun's generic "flag from the environment" and
# wins over the first, so both are set to keep a stray user value from cutting the grace short.
SHUTDOWN_TIMEOUT_VARIABLES = ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT")
SHUTDOWN_MARGIN_SECONDS = 10


@dataclass(frozen=True)
class LaunchPlan:
    """What one start of the workers runs: the command and the variables added to the env."""

    command: list[str]
    environment: dict[str, str]


MONITOR_INTERVAL = 0.02
DEFAULT_MASTER_PORT = 29500
"""torchrun's own default port for node 0's store."""


_LAUNCH_FLAGS = {"script": [], "module": ["--module"], "no_python": ["--no-python"],
                 "run_path": ["--run-path"]}


RESTART_CEILING = 1_000_000
"""torchrun's ``--max-restarts`` where cycle's budget decides (in the launcher): torchrun keeps
counting its restarts (``TORCHELASTIC_RESTART_COUNT``) and never gives up on its own."""
LAUNCHER = "cycler.supervisor.launch.launcher"
"""torchrun's own ``main``, quiet about the stops cycle asked for (:mod:`.launcher`)."""


def torchrun_command(options: RunOptions, python: str = sys.executable) -> list[str]:
    """``python -m cycler.supervisor.launch.launcher ...`` (torchrun) for ``options``, script
    arguments untouched.

    The options cycle does not own (``torchrun_args``) come after cycle's, so where both set
    one (``--monitor-interval``), torchrun takes the user's.
    """
    nnodes = str(options.nnodes)
    if options.min_nodes is not None:
        nnodes = f"{options.min_nodes}:{options.nnodes}"
    command = [python, "-m", LAUNCHER, *_launcher_arguments(options),
               "--nproc-per-node", str(options.nproc_per_node),
               "--nnodes", nnodes,
               "--max-restarts", str(RESTART_CEILING if restarts_by_torchrun(options) else 0),
               # torchrun notices exited workers only at this interval (default 0.1 s): every
               # stop waits for it, and a 20 ms poll of a few pids costs nothing measurable.
               "--monitor-interval", str(MONITOR_INTERVAL)]
    command += _rendezvous_arguments(options)
    command += [*options.torchrun_args, *_LAUNCH_FLAGS[options.launch_mode]]
    return command + [str(options.script), *options.script_args]


def forks_workers(options: RunOptions) -> bool:
    """Whether torchrun's agent forks the workers (:mod:`.forked`): asked for, a script (not
    a module, an executable or ``--run-path``), a number of processes (counting the GPUs may
    initialise CUDA in the agent), and no start method of the user's."""
    return (options.fork_workers and options.launch_mode == "script"
            and isinstance(options.nproc_per_node, int)
            and not _has_option(options.torchrun_args, "--start-method", "--start_method"))


DYNAMO_USERS = (b"DistributedDataParallel", b"torch.compile", b"fully_shard",
                b"FullyShardedDataParallel", b"_dynamo")
"""Names in a script that make its workers import ``torch._dynamo`` (1.9 s here)."""


def fork_preloads(script: str | Path) -> str:
    """What the agent imports for ``script``'s forked workers beyond torch's common modules:
    ``torch._dynamo`` where the script names what imports it (DDP's constructor does), so that
    the workers do not each import it again, side by side; ``1`` for nothing more. A script
    that never needs it (or that only an imported module of it uses) is not delayed by it.

    Nor a script that writes a variable that dynamo's import reads (:data:`READ_BY_DYNAMO`),
    or one it does not name: a fresh worker imports dynamo at its first DDP or ``torch.compile``,
    after the script's writes."""
    text = read_source(script)
    if text is None or any(_read_by_dynamo(write.name) for write in environment_writes(text)):
        return "1"
    return "torch._dynamo" if any(name in text for name in DYNAMO_USERS) else "1"


READ_BY_DYNAMO = ("TORCH", "PYTORCH", "INDUCTOR", "AOT", "TRITON", "SYMPY", "MPMATH", "CUTLASS",
                  "CUTEDSL", "PT2", "PARTITIONER", "ENABLE_", "FAKE_", "LOG_", "DUMP_", "UNSAFE_",
                  "TMP", "TEMP", "HOME", "CXX", "USER", "LOGNAME", "LNAME", "CI", "os.environ",
                  "load_dotenv")
"""The beginnings of the variables that ``import torch._dynamo`` reads after ``import torch``
(torch 2.13: every name looked up in ``os.environ`` during that import), and of the writes
whose variable the script does not name (``os.environ.update``, ``load_dotenv``)."""


def _read_by_dynamo(name: str) -> bool:
    return name.startswith(READ_BY_DYNAMO) or name in ("putenv", "unsetenv")


def restarts_by_torchrun(options: RunOptions) -> bool:
    """Whether torchrun's agent restarts failed workers (multi-node jobs), not the supervisor."""
    return options.nnodes > 1


def _launcher_arguments(options: RunOptions) -> list[str]:
    forking = [f"--cycle-fork={fork_preloads(options.script)}"] if forks_workers(options) \
        else []
    if not restarts_by_torchrun(options):
        return forking
    root = options.layout.root
    arguments = [f"--cycle-restarts={options.max_restarts}",
                 f"--cycle-checkpoints={root}",
                 f"--cycle-checkpoint-name={options.checkpoint_name}",
                 f"--cycle-restart-delay={options.restart_delay:g}",
                 f"--cycle-node-rank={options.node_rank}"]
    if options.min_nodes is None and options.rdzv_endpoint is None:
        arguments.append(f"--cycle-fixed-nodes={options.nnodes}")
    return arguments + forking


JOIN_MARGIN = 30.0
"""Seconds torchrun's rendezvous waits for the nodes beyond ``--start-timeout``."""


def _rendezvous_arguments(options: RunOptions) -> list[str]:
    run_id = options.rdzv_id or options.slurm_job_id or "cycler"
    if options.rdzv_endpoint is not None:
        return ["--rdzv-backend", options.rdzv_backend or "c10d",
                "--rdzv-endpoint", options.rdzv_endpoint, "--rdzv-id", run_id]
    if options.standalone or options.master_addr is None and options.master_port is None:
        return ["--standalone"]
    host = options.master_addr or "127.0.0.1"
    if options.nnodes == 1:
        arguments = ["--node-rank", str(options.node_rank), "--master-addr", host]
        if options.master_port is not None:
            arguments += ["--master-port", str(options.master_port)]
        return arguments
    # Several nodes: c10d at node 0's address. Node 0 hosts its store because it is node 0,
    # not because torch recognises the address as its own (which fails on hosts with several
    # interfaces or names, and in network namespaces); a --rdzv-conf of the user's wins.
    port = options.master_port or DEFAULT_MASTER_PORT
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    arguments = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]
    if not _has_option(options.torchrun_args, "--rdzv-conf", "--rdzv_conf"):
        # The rendezvous outwaits the supervisor's start timeout: a node that never comes is
        # named by the supervisor, not reported as the workers' failure.
        join = options.start_timeout + JOIN_MARGIN
        arguments += ["--rdzv-conf", f"is_host={int(options.node_rank == 0)},join_timeout={join:g}"]
    return arguments


def store_port(options: RunOptions) -> int | None:
    """The port torchrun's agent on this node listens on, when it is a fixed one: node 0's
    ``--master-port`` (torchrun's 29500 when only ``--master-addr`` is given). ``None``:
    ``--standalone`` picks a free port, the host of a ``--rdzv-endpoint`` is decided by torch,
    and the other nodes listen on none."""
    if (options.node_rank != 0 or options.rdzv_endpoint is not None or options.standalone
            or options.master_addr is None and options.master_port is None):
        return None
    return options.master_port or DEFAULT_MASTER_PORT


def _has_option(arguments: tuple[str, ...], *names: str) -> bool:
    return any(argument.split("=", 1)[0] in names for argument in arguments)


def lossy_directory(options: RunOptions) -> Path:
    """ISC's ``LOSSY_ARTIFACT_PATH`` for this run: a sibling of the checkpoint root, for logs
    and tensorboard files that need no atomic commit (``<root>-lossy``)."""
    root = options.layout.root
    return root.with_name(f"{root.name}-lossy")


def isc_environment(options: RunOptions, environ: Mapping[str, str]) -> dict[str, str]:
    """ISC's artifact variables that scripts read, for those the user has not set: the
    checkpoint root always; ``<root>-lossy`` only where ISC's contract asks for it (its
    ``CHECKPOINT_ARTIFACT_PATH`` is set): off ISC, nothing is made beside the root."""
    names = {ENV_ISC_ARTIFACT_PATH: options.layout.root}
    if environ.get(ENV_ISC_ARTIFACT_PATH):
        names[ENV_ISC_LOSSY_PATH] = lossy_directory(options)
    return {name: str(path) for name, path in names.items() if not environ.get(name)}


def worker_environment(options: RunOptions, *, start_number: int, resume_from: str | None,
                       environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables ``cycle run`` adds for one start (``start_number``: earlier local starts)
    to ``environ`` (default: this process's environment)."""
    layout, node = options.layout, options.node_files
    environment = {
        ENV_CONTROL_FILE: str(node.control_path),
        ENV_CHECKPOINT_DIR: str(layout.root),
        ENV_CHECKPOINT_NAME: options.checkpoint_name,
        ENV_NODE_DIR: str(options.runtime_dir),
        ENV_PROGRESS_DIR: str(node.progress_dir),
        ENV_RESTART_COUNT: str(options.requeue_count + start_number),
        ENV_STOP_SIGNALS: ",".join(options.signals),
        **isc_environment(options, os.environ if environ is None else environ),
    }
    if resume_from is not None:
        environment[ENV_RESUME_FROM] = resume_from
    if options.memory_layout is not None:  # computed here once: workers take it as it is
        environment[ENV_MEMORY_TIER] = str(options.memory_layout.root)
        environment[ENV_PERSIST_EVERY] = str(options.persist_every)
    environment.update(compile_cache_environment(options, os.environ if environ is None
                                                 else environ))
    timeout = str(math.ceil(options.grace) + SHUTDOWN_MARGIN_SECONDS)
    environment.update(dict.fromkeys(SHUTDOWN_TIMEOUT_VARIABLES, timeout))
    return environment


def launch_plan(options: RunOptions, *, start_number: int = 0, resume_from: str | None = None,
                environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """The command and added environment of one start (what ``--dry-run`` prints)."""
    resume = options.resume_from if resume_from is None and start_number == 0 else resume_from
    environment = worker_environment(options, start_number=start_number, resume_from=resume,
                                     environ=environ)
    return LaunchPlan(torchrun_command(options), environment)


def full_environment(plan: LaunchPlan, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the plan's variables on top.

    A ``CYCLER_RESUME_FROM`` inherited from the caller is dropped: only the plan decides which
    start resumes from a named checkpoint, so a restart after new progress never goes back.
    """
    environment = dict(os.environ if base is None else base)
    environment.pop(ENV_RESUME_FROM, None)
    return {**environment, **plan.environment}
