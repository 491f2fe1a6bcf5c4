"""``cycle run``: parse the flags, resolve the options, call the supervisor, map the outcome."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from cycler.exit_codes import EXIT_FAILURE
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
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(run)


def run(
    script: Path = typer.Argument(..., metavar="SCRIPT", help="The training script.",
                                 show_default=False),
    args: list[str] = typer.Argument(None, metavar="ARGS", help="Arguments for the script.",
                                    show_default=False),
    nproc_per_node: int = typer.Option(None, "--nproc-per-node", help="Workers on this node "
                                       "(default: $N_PROC, $SLURM_GPUS_ON_NODE, 1)."),
    nnodes: int = typer.Option(None, "--nnodes",
                               help="Nodes (default: $NNODES, $SLURM_NNODES, 1)."),
    node_rank: int = typer.Option(None, "--node-rank",
                                  help="This node's rank (default: $NODE_RANK, $SLURM_NODEID, 0)."),
    master_addr: str = typer.Option(None, "--master-addr", help="Node 0's address "
                                    "(default: $MASTER_ADDR, first host of $SLURM_JOB_NODELIST)."),
    master_port: int = typer.Option(None, "--master-port", help="Node 0's port "
                                    "(default: $MASTER_PORT, derived from $SLURM_JOB_ID)."),
    rdzv_endpoint: str = typer.Option(None, "--rdzv-endpoint",
                                      help="host:port of a c10d rendezvous (instead of master)."),
    checkpoint_dir: Path = typer.Option(None, "--checkpoint-dir", help="Checkpoint root "
                                        "(default: $CYCLER_CHECKPOINT_DIR, "
                                        "$CHECKPOINT_ARTIFACT_PATH, ./checkpoints)."),
    checkpoint_name: str = typer.Option(None, "--checkpoint-name",
                                        help="The saver's name= (default: AtomicDirectory)."),
    grace: float = typer.Option(None, "--grace", help="Seconds to checkpoint and exit after a "
                                "stop signal (default: 60)."),
    max_restarts: int = typer.Option(None, "--max-restarts",
                                     help="Restarts after worker failures (default: 3)."),
    restart_delay: float = typer.Option(None, "--restart-delay", help="Seconds before the first "
                                        "restart, doubling without progress (default: 1)."),
    requeue: bool = typer.Option(None, "--requeue/--no-requeue", help="scontrol requeue after a "
                                 "stop (default: on under Slurm)."),
    max_requeues: int = typer.Option(None, "--max-requeues", help="Requeues allowed, against "
                                     "$SLURM_RESTART_COUNT (default: 100)."),
    resume_from: str = typer.Option(None, "--resume-from", help="Start from this checkpoint "
                                    "(name or index) instead of the latest."),
    signals: str = typer.Option(None, "--signals", help="Signals that ask for checkpoint and "
                                "exit (default: TERM,INT,HUP,USR2)."),
    config: Path = typer.Option(None, "--config", help="YAML file with any of these options; "
                                "flags win."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the torchrun command and the "
                                 "environment it adds; start nothing."),
) -> None:
    flags = {
        "nproc_per_node": nproc_per_node, "nnodes": nnodes, "node_rank": node_rank,
        "master_addr": master_addr, "master_port": master_port, "rdzv_endpoint": rdzv_endpoint,
        "checkpoint_dir": checkpoint_dir, "checkpoint_name": checkpoint_name, "grace": grace,
        "max_restarts": max_restarts, "restart_delay": restart_delay, "requeue": requeue,
        "max_requeues": max_requeues, "resume_from": resume_from, "signals": signals,
    }
    with exit_on_cycler_error():
        options = resolve_run_options(script=script, script_args=args or [], flags=flags,
                                      config_file=config, environ=os.environ)
        if dry_run:
            _print_plan(plan_run(options))
            return
        outcome = run_supervisor(options)
    _report(outcome)
    raise typer.Exit(outcome.exit_code)


def _print_plan(plan: LaunchPlan) -> None:
    for name, value in sorted(plan.environment.items()):
        sys.stdout.write(f"{name}={shlex.quote(value)}\n")
    sys.stdout.write(shlex.join(plan.command) + "\n")


def _report(outcome: RunOutcome) -> None:
    if outcome.exit_code == EXIT_FAILURE:
        _stderr.print(f"[red]cycle: error:[/red] {escape(outcome.reason)}", markup=True)
    if outcome.failure is not None:
        _stderr.print(escape(outcome.failure), markup=True)
