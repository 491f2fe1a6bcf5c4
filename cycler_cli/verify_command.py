"""``cycle verify``: parse, call :func:`cycler.verify.verify`, render, exit with its code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from cycler.errors import ConfigError
from cycler.supervisor.configuration.options import load_config_file
from cycler_cli import render
from cycler_cli.errors import exit_on_cycler_error
from cycler_cli.help_format import Command

CYCLE_RUN = (sys.executable, "-m", "cycler_cli", "run")
"""How verify starts each ``cycle run``: this interpreter, this CLI."""

HELP = (
    "Prove that a stopped and resumed run of SCRIPT ends identical to an uninterrupted one. "
    "Runs it as cycle run would, to the end, then again with stops (and kill -9s) at random "
    "steps after its first checkpoint, and compares every checkpoint both runs committed at the "
    "same step, bit for bit. Put verify's options first; cycle run's options, SCRIPT and its "
    "arguments follow, passed to cycle run unchanged."
)
EPILOG = ("Exit codes: 0 identical; 1 a checkpoint after a resume differs (the report names the "
          "file, the key and the likely cause); 2 bad usage, or the script commits no cycler "
          "checkpoints; 3 the script is not deterministic (two uninterrupted runs differ); 4 a "
          "run of the script failed; 130 interrupted (Ctrl-C).")


def register(app: typer.Typer) -> None:
    """Add the ``verify`` command to ``app``."""

    def verify_command(
        ctx: typer.Context,
        command: list[str] = typer.Argument(None, metavar="[CYCLE RUN OPTIONS] SCRIPT [ARGS]...",
                                            show_default=False),
        stops: int = typer.Option(3, "--stops", min=0, help="Stops (stop signal, then a "
                                  "fresh cycle run) of the interrupted run (default: 3)."),
        kills: int = typer.Option(0, "--kills", min=0, help="kill -9s of a worker (cycle run "
                                  "restarts it) of the interrupted run (default: 0)."),
        seed: int = typer.Option(None, "--seed", help="Seed of the interruption steps "
                                 "(default: random, reported)."),
        determinism_check: bool = typer.Option(True, "--determinism-check/"
                                               "--no-determinism-check", help="Report a "
                                               "difference before the first interruption as "
                                               "nondeterminism (exit 3), not as a resume's "
                                               "(default: on)."),
        scratch_dir: Path = typer.Option(None, "--scratch-dir", help="A private directory "
                                         "(0700) for the runs (default: one under $TMPDIR)."),
        keep: bool = typer.Option(False, "--keep", help="Keep the runs even when identical."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        from cycler.verify import VerifyOptions, verify

        run_args = list(command or [])
        with exit_on_cycler_error():
            run_args, caller_imports = _run_args_for_a_workdir(app, ctx, run_args)
            options = VerifyOptions(run_args=run_args, caller_imports=caller_imports,
                                    cycle_run=CYCLE_RUN, stops=stops, kills=kills, seed=seed,
                                    determinism_check=determinism_check,
                                    scratch_dir=scratch_dir, keep=keep)
            with render.verify_progress(enabled=not as_json) as (progress, compared):
                result = verify(options, progress, compared)
        if as_json:
            render.print_json(result.as_dict())
        else:
            render.render_verify(result)
        raise typer.Exit(result.exit_code)

    app.command("verify", cls=Command, help=HELP, epilog=EPILOG,
                short_help="Prove that a stopped and resumed run ends identical.",
                context_settings={
        "allow_interspersed_args": False, "ignore_unknown_options": True})(verify_command)


def _run_args_for_a_workdir(app: typer.Typer, ctx: typer.Context,
                            run_args: list[str]) -> tuple[list[str], Path | None]:
    """``run_args`` for runs that work in directories of their own: SCRIPT made absolute
    where it is a path relative to this directory, and the directory a module (``-m``) is
    imported from (``None``: not a module). Refuses a --checkpoint-dir: verify gives each run
    its own checkpoint root (with the user's both runs would share it)."""
    group: Any = typer.main.get_command(app)  # a click group (typer vendors its click)
    run = group.get_command(ctx, "run")
    if run is None:
        return run_args, None
    parsed: dict[str, Any] = run.make_context("run", list(run_args), resilient_parsing=True,
                                              parent=ctx.parent).params
    if not parsed.get("script"):
        raise ConfigError("cycle verify needs the script to run: cycle verify [OPTIONS] "
                          "[CYCLE RUN OPTIONS] SCRIPT [ARGS]...")
    from_file = {} if parsed.get("config") is None else load_config_file(parsed["config"])
    if parsed.get("checkpoint_dir") is not None or from_file.get("checkpoint_dir") is not None:
        raise ConfigError("cycle verify gives each run its own checkpoint root in its scratch "
                          "directory: leave out --checkpoint-dir"
                          + ("" if parsed.get("checkpoint_dir") is not None else
                             f" (checkpoint_dir in {parsed['config']})"))
    run_args = _config_for_a_workdir(run_args, parsed, from_file)
    if parsed.get("module"):
        return run_args, Path.cwd()
    script, tail = parsed["script"], list(parsed.get("args") or [])
    at = next(i for i in range(len(run_args) - len(tail) - 1, -1, -1) if run_args[i] == script)
    if Path(script).exists():
        return [*run_args[:at], str(Path(script).resolve()), *run_args[at + 1:]], None
    return run_args, None


def _config_for_a_workdir(run_args: list[str], parsed: dict[str, Any],
                          from_file: dict[str, Any]) -> list[str]:
    """``run_args`` with a ``--config`` FILE made absolute (the runs work elsewhere), and the
    file's memory directory given as ``--memory-dir`` where no flag names one: verify reads the
    runs' memory tier from there (a relative one, as ``cycle run`` takes it, from the run's
    working directory)."""
    if parsed.get("config") is None:
        return run_args
    absolute = str(Path(parsed["config"]).resolve())
    at = next(i for i, a in enumerate(run_args) if a == "--config" or a.startswith("--config="))
    run_args = list(run_args)  # cycle run's own comes first: the script's options follow it
    if run_args[at] == "--config":
        run_args[at + 1] = absolute
    else:
        run_args[at] = f"--config={absolute}"
    memory_dir = from_file.get("memory_dir")
    if memory_dir is None and isinstance(from_file.get("memory_tier"), str):
        memory_dir = from_file["memory_tier"]  # YAML's memory_tier: /mnt/ram
    if memory_dir is None or parsed.get("memory_dir") is not None:
        return run_args
    return ["--memory-dir", str(memory_dir), *run_args]
