"""``cycle run``: parse the flags, resolve the options, call the supervisor, map the outcome."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from cycler.checkpoint.memory_roots import DEFAULT_MEMORY_DIR
from cycler.checkpoint.tiers import DEFAULT_PERSIST_EVERY
from cycler.errors import ConfigError
from cycler.protocol.exit_codes import EXIT_FAILURE
from cycler.supervisor import LaunchPlan, RunOutcome, plan_run, resolve_run_options, run_supervisor
from cycler_cli.errors import exit_on_cycler_error

_stderr = Console(stderr=True, highlight=False, soft_wrap=True)

HELP = (
    "Run SCRIPT under torchrun, supervised: stop signals become a checkpoint and a clean exit, "
    "crashed workers are restarted from the latest checkpoint. Everything after SCRIPT goes to "
    "the script untouched.\n\n"
    "Exit codes: 0 finished, 1 failed (restarts used up or crash loop), 2 bad usage (nothing "
    "started), 75 stopped after a checkpoint (requeue me)."
)


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to ``app``."""
    app.command(
        "run",
        help=HELP,
        epilog="Exit codes: 0 the script finished; 1 the workers failed and restarts are used "
               "up (or a crash loop, or a stop with nothing to resume); 2 bad usage or "
               "configuration, nothing started; 75 stopped after a committed checkpoint: "
               "requeue me.",
        # torchrun takes every option with underscores too (--nproc_per_node): click matches
        # option names after this normalisation, so both spellings work and --help lists one.
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True,
                          "token_normalize_func": _dashes},
    )(run)


_TORCHRUN = "torchrun options (passed to torchrun unchanged)"


def _memory_tier(on: bool | None, directory: Path | None) -> Path | bool | None:
    """``--memory-tier``/``--memory-dir`` as the option's value (``None``: not given)."""
    if on is False or directory is None:
        return on
    return directory


def _dashes(name: str) -> str:
    """An option's name (click passes it without its leading dashes) spelled with dashes."""
    return name.replace("_", "-")


def _passed(help_text: str, *names: str) -> Any:
    return typer.Option(None, *names, help=help_text, rich_help_panel=_TORCHRUN,
                        show_default=False)


# cycle run's parameter -> torchrun's option, for the options cycle does not own.
_PASSED_THROUGH = {
    "rdzv_conf": "--rdzv-conf", "monitor_interval": "--monitor-interval",
    "start_method": "--start-method", "role": "--role", "log_dir": "--log-dir",
    "redirects": "--redirects", "tee": "--tee", "local_ranks_filter": "--local-ranks-filter",
    "local_addr": "--local-addr", "logs_specs": "--logs-specs",
    "numa_binding": "--numa-binding", "event_log_handler": "--event-log-handler",
    "duplicate_stdout_filters": "--duplicate-stdout-filters",
    "duplicate_stderr_filters": "--duplicate-stderr-filters",
    "signals_to_handle": "--signals-to-handle", "shutdown_timeout": "--shutdown-timeout",
}
_PASSED_FLAGS = {"virtual_local_rank": "--virtual-local-rank"}


def run(
    script: str = typer.Argument(..., metavar="SCRIPT", help="The training script (a module "
                                "with -m, an executable with --no-python).", show_default=False),
    args: list[str] = typer.Argument(None, metavar="ARGS", help="Arguments for the script.",
                                    show_default=False),
    nproc_per_node: str = typer.Option(None, "--nproc-per-node", help="Workers on "
                                       "this node, or auto/cpu/gpu/xpu (default: $N_PROC, "
                                       "$SLURM_GPUS_ON_NODE, 1)."),
    nnodes: str = typer.Option(None, "--nnodes", help="Nodes, or MIN:MAX for an elastic job "
                               "(default: $NNODES, $SLURM_NNODES, 1)."),
    node_rank: int = typer.Option(None, "--node-rank", help="This node's rank "
                                  "(default: $NODE_RANK, $SLURM_NODEID, 0)."),
    master_addr: str = typer.Option(None, "--master-addr", help="Node 0's address "
                                    "(default: $MASTER_ADDR, first host of $SLURM_JOB_NODELIST)."),
    master_port: int = typer.Option(None, "--master-port", help="Node 0's port "
                                    "(default: $MASTER_PORT, derived from $SLURM_JOB_ID)."),
    rdzv_endpoint: str = typer.Option(None, "--rdzv-endpoint",
                                      help="host:port of a c10d rendezvous (instead of master)."),
    rdzv_backend: str = typer.Option(None, "--rdzv-backend", help="Rendezvous "
                                     "backend for --rdzv-endpoint (default: c10d)."),
    rdzv_id: str = typer.Option(None, "--rdzv-id", help="Rendezvous id shared by "
                                "the job's nodes (default: $SLURM_JOB_ID, cycler)."),
    standalone: bool = typer.Option(None, "--standalone", help="One node, rendezvous on a free "
                                    "port (the default for one node).", show_default=False),
    module: bool = typer.Option(False, "-m", "--module", help="SCRIPT is a module, run as "
                                "python -m SCRIPT."),
    no_python: bool = typer.Option(False, "--no-python", help="Run SCRIPT itself, "
                                   "not with python."),
    run_path: bool = typer.Option(False, "--run-path", help="Run SCRIPT (an absolute "
                                  "path) with runpy.run_path in torchrun's worker."),
    checkpoint_dir: Path = typer.Option(None, "--checkpoint-dir", help="Checkpoint "
                                        "root (default: $CYCLER_CHECKPOINT_DIR, "
                                        "$CHECKPOINT_ARTIFACT_PATH, ./checkpoints)."),
    memory_tier: bool = typer.Option(None, "--memory-tier/--no-memory-tier", help="Commit "
                                     "every checkpoint in node memory first and persist some "
                                     "to the checkpoint root (one-node jobs; default: off)."),
    memory_dir: Path = typer.Option(None, "--memory-dir", help="The tmpfs where "
                                    "--memory-tier keeps them, in a private cycler-<uid> "
                                    "directory (implies it; default: $XDG_RUNTIME_DIR, "
                                    f"else {DEFAULT_MEMORY_DIR})."),
    persist_every: int = typer.Option(None, "--persist-every", help="With --memory-tier: "
                                      "persist every K-th checkpoint (and every stop's) "
                                      f"(default: {DEFAULT_PERSIST_EVERY})."),
    checkpoint_name: str = typer.Option(None, "--checkpoint-name",
                                        help="The saver's name= (default: AtomicDirectory)."),
    grace: float = typer.Option(None, "--grace", help="Seconds to checkpoint and exit after a "
                                "stop signal (default: 60)."),
    max_restarts: int = typer.Option(None, "--max-restarts", help="Restarts after "
                                     "worker failures (default: 3)."),
    restart_delay: float = typer.Option(None, "--restart-delay", help="Seconds "
                                        "before the first restart, doubling without progress "
                                        "(default: 1)."),
    node_timeout: float = typer.Option(None, "--node-timeout", help="Seconds another node "
                                       "may go silent before this one gives the job up "
                                       "(default: 30)."),
    start_timeout: float = typer.Option(None, "--start-timeout", help="Seconds another node "
                                        "may stay unheard from the start before the job ends "
                                        "naming it (default: 600)."),
    hang_detection: bool = typer.Option(None, "--hang-detection/--no-hang-detection",
                                        help="Kill and restart workers that stop making "
                                        "progress (default: on)."),
    hang_timeout_min: float = typer.Option(None, "--hang-timeout-min", help="Least seconds "
                                           "without a step that count as a hang (default: 30)."),
    hang_factor: float = typer.Option(None, "--hang-factor", help="A hang: no step for max("
                                      "--hang-timeout-min, this x the longest step) "
                                      "(default: 5)."),
    hang_first_step: float = typer.Option(None, "--hang-first-step", help="Seconds allowed "
                                          "before the first step (default: 600)."),
    hang_pause_timeout: float = typer.Option(None, "--hang-pause-timeout", help="Seconds "
                                             "allowed while saving or in a marked phase "
                                             "(default: 1800)."),
    requeue: bool = typer.Option(None, "--requeue/--no-requeue", help="scontrol requeue after a "
                                 "stop (default: on under Slurm)."),
    max_requeues: int = typer.Option(None, "--max-requeues", help="Requeues allowed, "
                                     "against $SLURM_RESTART_COUNT (default: 100)."),
    resume_from: str = typer.Option(None, "--resume-from", help="Start from this "
                                    "checkpoint (name or index) instead of the latest."),
    signals: str = typer.Option(None, "--signals", help="Signals that ask for checkpoint and "
                                "exit (default: TERM,INT,HUP,USR2)."),
    preemption_notices: str = typer.Option(None, "--preemption-notices", help="Poll the "
                                           "cloud's metadata service for preemption notices "
                                           "and stop on one: auto (the cloud this machine's "
                                           "identity names, nothing elsewhere), aws, gcp, "
                                           "azure or off (default: auto)."),
    metadata_endpoint: str = typer.Option(None, "--metadata-endpoint", help="Base URL of "
                                          "the metadata service (default: the cloud's)."),
    config: Path = typer.Option(None, "--config", help="YAML file with any of these options; "
                                "flags win."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the torchrun "
                                 "command and the environment it adds; start nothing."),
    rdzv_conf: str = _passed("key=value,... for the rendezvous.", "--rdzv-conf"),
    monitor_interval: float = _passed("Seconds between torchrun's checks of its workers "
                                      "(cycle's default: 0.02).", "--monitor-interval"),
    start_method: str = _passed("spawn, fork or forkserver.", "--start-method"),
    role: str = _passed("User-defined role of the workers.", "--role"),
    log_dir: str = _passed("Directory for torchrun's worker logs.", "--log-dir"),
    redirects: str = _passed("Redirect worker streams to files in --log-dir.", "-r",
                             "--redirects"),
    tee: str = _passed("Tee worker streams to files in --log-dir.", "-t", "--tee"),
    local_ranks_filter: str = _passed("Only show these local ranks' output.",
                                      "--local-ranks-filter"),
    local_addr: str = _passed("This node's address.", "--local-addr"),
    logs_specs: str = _passed("torchrun.logs_specs entry point.", "--logs-specs"),
    numa_binding: str = _passed("Bind workers to CPUs near their GPUs.",
                                "--numa-binding"),
    event_log_handler: str = _passed("Registered event log handler.",
                                     "--event-log-handler"),
    duplicate_stdout_filters: str = _passed("Duplicate matching stdout lines to a file.",
                                            "--duplicate-stdout-filters"),
    duplicate_stderr_filters: str = _passed("Duplicate matching stderr lines to a file.",
                                            "--duplicate-stderr-filters"),
    signals_to_handle: str = _passed("Signals torchrun itself forwards to its workers.",
                                     "--signals-to-handle"),
    shutdown_timeout: float = _passed("Seconds torchrun waits for workers after a signal "
                                      "(cycle's default: grace + 10).",
                                      "--shutdown-timeout"),
    virtual_local_rank: bool = typer.Option(False, "--virtual-local-rank",
                                            help="LOCAL_RANK 0 for every worker.",
                                            rich_help_panel=_TORCHRUN),
) -> None:
    passed = locals()
    flags = {
        "nproc_per_node": nproc_per_node, "nnodes": nnodes, "node_rank": node_rank,
        "master_addr": master_addr, "master_port": master_port, "rdzv_endpoint": rdzv_endpoint,
        "rdzv_backend": rdzv_backend, "rdzv_id": rdzv_id, "standalone": standalone,
        "checkpoint_dir": checkpoint_dir, "checkpoint_name": checkpoint_name, "grace": grace,
        "memory_tier": _memory_tier(memory_tier, memory_dir), "persist_every": persist_every,
        "max_restarts": max_restarts, "restart_delay": restart_delay, "requeue": requeue,
        "node_timeout": node_timeout, "start_timeout": start_timeout,
        "hang_detection": hang_detection,
        "hang_timeout_min": hang_timeout_min, "hang_factor": hang_factor,
        "hang_first_step": hang_first_step, "hang_pause_timeout": hang_pause_timeout,
        "max_requeues": max_requeues, "resume_from": resume_from, "signals": signals,
        "preemption_notices": preemption_notices, "metadata_endpoint": metadata_endpoint,
        "launch_mode": _launch_mode(module, no_python, run_path),
        "torchrun_args": _torchrun_arguments(passed),
    }
    with exit_on_cycler_error():
        if script.startswith("-"):
            raise ConfigError(f"cycle run has no option {script}; see cycle run --help (put "
                              "options for the script after SCRIPT)")
        options = resolve_run_options(script=script, script_args=args or [], flags=flags,
                                      config_file=config, environ=os.environ)
        if dry_run:
            _print_plan(plan_run(options))
            return
        outcome = run_supervisor(options)
    _report(outcome)
    raise typer.Exit(outcome.exit_code)


def _launch_mode(module: bool, no_python: bool, run_path: bool) -> str | None:
    # torchrun's own precedence: --run-path, then --no-python, then -m.
    chosen = [mode for mode, on in (("run_path", run_path), ("no_python", no_python),
                                    ("module", module)) if on]
    return chosen[0] if chosen else None


def _torchrun_arguments(passed: dict[str, Any]) -> list[str]:
    arguments: list[str] = []
    for name, option in _PASSED_THROUGH.items():
        if passed[name] is not None:
            arguments += [option, f"{passed[name]:g}" if isinstance(passed[name], float)
                          else str(passed[name])]
    return arguments + [option for name, option in _PASSED_FLAGS.items() if passed[name]]


def _print_plan(plan: LaunchPlan) -> None:
    for name, value in sorted(plan.environment.items()):
        sys.stdout.write(f"{name}={shlex.quote(value)}\n")
    sys.stdout.write(shlex.join(plan.command) + "\n")


def _report(outcome: RunOutcome) -> None:
    if outcome.exit_code == EXIT_FAILURE:
        _stderr.print(f"[red]cycle: error:[/red] {escape(outcome.reason)}", markup=True)
    if outcome.failure is not None:
        _stderr.print(escape(outcome.failure), markup=True)
