"""``cycle run``: parse the flags, resolve the options, call the supervisor, map the outcome."""

from __future__ import annotations

import inspect
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from cycler.errors import ConfigError
from cycler.protocol.exit_codes import EXIT_FAILURE, MEANINGS
from cycler.supervisor.configuration.flags import declared, help_line
from cycler.supervisor.configuration.options import RunOptions, resolve_run_options
from cycler_cli.errors import exit_on_cycler_error
from cycler_cli.help_format import Command

if TYPE_CHECKING:
    from cycler.supervisor import LaunchPlan, RunOutcome

_stderr = Console(stderr=True, highlight=False, soft_wrap=True)

HELP = (
    "Run SCRIPT under torchrun, supervised: stop signals become a checkpoint and a clean exit, "
    "crashed workers are restarted from the latest checkpoint. Everything after SCRIPT goes to "
    "the script untouched."
)
EXIT_CODES = "Exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in MEANINGS.items())


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to ``app``."""
    app.command(
        "run",
        cls=Command,
        help=HELP,
        short_help="Run a training script under torchrun, supervised.",
        epilog=EXIT_CODES + ".",
        # torchrun takes every option with underscores too (--nproc_per_node): click matches
        # option names after this normalisation, so both spellings work and --help lists one.
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True,
                          "token_normalize_func": _dashes},
    )(run)


_TORCHRUN = "torchrun options (passed to torchrun unchanged)"


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


def _undeclared(
    module: bool = typer.Option(False, "-m", "--module", help="SCRIPT is a module, run as "
                                "python -m SCRIPT."),
    no_python: bool = typer.Option(False, "--no-python", help="Run SCRIPT itself, "
                                   "not with python."),
    run_path: bool = typer.Option(False, "--run-path", help="Run SCRIPT (an absolute "
                                  "path) with runpy.run_path in torchrun's worker."),
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
    """The options of ``cycle run`` that are not :class:`RunOptions` fields: how SCRIPT is
    started, where the memory tier is, the config file, ``--dry-run``, and torchrun's own.
    Only its signature is used (see :func:`_signature`)."""


def _signature() -> inspect.Signature:
    """SCRIPT, ARGS, then every declared RunOptions field as its flag, then the rest."""
    script = inspect.Parameter(
        "script", inspect.Parameter.KEYWORD_ONLY, annotation=str,
        default=typer.Argument(..., metavar="SCRIPT", show_default=False,
                               help="The training script (a module with -m, an executable "
                                    "with --no-python)."))
    args = inspect.Parameter(
        "args", inspect.Parameter.KEYWORD_ONLY, annotation=list[str],
        default=typer.Argument(None, metavar="ARGS", help="Arguments for the script.",
                               show_default=False))
    declared_options = [
        inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, annotation=flag.kind,
                          default=typer.Option(None, *flag.names, show_default=False,
                                               help=help_line(field, flag)))
        for field, flag in declared(RunOptions)]
    rest = inspect.signature(_undeclared, eval_str=True).parameters.values()
    return inspect.Signature([script, args, *declared_options,
                              *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in rest)])


def run(**passed: Any) -> None:
    """``cycle run``: the flags as :class:`RunOptions`, then the supervisor (or the plan)."""
    # The supervisor's shell (psutil, the core, the process tree) loads only to run: every
    # other cycle command, and --help, registers this one and would pay for it.
    from cycler.supervisor import plan_run, run_supervisor

    script = passed["script"]
    with exit_on_cycler_error():
        if script.startswith("-"):
            raise ConfigError(f"cycle run has no option {script}; see cycle run --help (put "
                              "options for the script after SCRIPT)")
        options = resolve_run_options(script=script, script_args=passed["args"] or [],
                                      flags=_flags(passed), config_file=passed["config"],
                                      environ=os.environ)
        if passed["dry_run"]:
            _print_plan(plan_run(options))
            return
        outcome = run_supervisor(options)
    _report(outcome)
    raise typer.Exit(outcome.exit_code)


run.__signature__ = _signature()  # type: ignore[attr-defined]


def _flags(passed: dict[str, Any]) -> dict[str, Any]:
    """The command line as RunOptions' fields (``None``: not given)."""
    flags = {field.name: passed[field.name] for field, _ in declared(RunOptions)}
    flags["launch_mode"] = _launch_mode(passed["module"], passed["no_python"], passed["run_path"])
    flags["torchrun_args"] = _torchrun_arguments(passed)
    return flags


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
    if outcome.exit_code == EXIT_FAILURE:  # exit 74's line was the persist_failed event's
        _stderr.print(f"[red]cycle: error:[/red] {escape(outcome.reason)}", markup=True)
    if outcome.failure is not None:
        _stderr.print(escape(outcome.failure), markup=True)
