"""Every table and colour of the ``cycle`` command lives here."""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cycler.checkpoint.inspection import CheckpointFacts, MemoryTierStatus, PruneResult, RootStatus
from cycler.protocol.events import counted, describe
from cycler.protocol.goodput import Goodput
from cycler.protocol.timeline import LEGEND

if TYPE_CHECKING:  # cycle's other commands must not import torch through verify's modules
    from cycler.verify.result import FirstDifference, VerifyResult
    from cycler.verify.runner import Resume

console = Console(highlight=False)

_STATE_STYLES = {"latest": "bold green", "valid": "green", "pinned": "cyan",
                 "incomplete": "yellow", "corrupt": "bold red"}


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def human_age(seconds: float) -> str:
    seconds = int(seconds)
    for span, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= span:
            return f"{seconds // span}{unit} ago"
    return f"{seconds}s ago"


def print_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True, default=str))


STATUS_ROWS = 10
"""Checkpoints ``cycle status`` lists per table, newest first kept (``--all``: every one)."""


def render_status(status: RootStatus, rows: int | None = STATUS_ROWS) -> None:
    """The status as tables and lines; ``rows``: the newest checkpoints listed per table, the
    rest counted in one line (``None``: every one)."""
    if not status.exists:
        console.print(f"No checkpoint directory at {escape(str(status.root))}.", soft_wrap=True)
        for note in status.notes:
            console.print(f"[yellow]warning:[/] {escape(note)}")
        return
    if not status.checkpoints:
        console.print(f"No checkpoints in {escape(str(status.root))}.", soft_wrap=True)
    else:
        _print_status_table(status.checkpoints, status.root, rows=rows)
    if status.memory is not None:
        _render_memory_tier(status.memory, rows)
    for note in status.notes:
        console.print(f"[yellow]warning:[/] {escape(note)}")
    _render_supervisors(status.supervisors)
    _render_goodput(status.goodput)
    _render_timeline(status.timeline)
    _render_replays(status.replays)
    _render_events(status.events, status.counts)


def _render_replays(replays: list[dict[str, Any]]) -> None:
    """Each restart's check of its replayed steps, the latest last (a divergence in red)."""
    for event in replays[-5:]:
        style = {"replay_diverged": "red", "replay_unchecked": "yellow"}.get(
            str(event.get("event")), "green")
        node = event.get("node")
        console.print(f"[{style}]Replayed steps[/] (node {node}): {escape(str(event.get('said')))}",
                      soft_wrap=True)


def _render_memory_tier(memory: MemoryTierStatus, rows: int | None) -> None:
    if memory.checkpoints:
        _print_status_table(memory.checkpoints, memory.root, "in memory at ", rows)
    else:
        console.print(f"No checkpoints in the memory tier at {escape(str(memory.root))}.")
    if memory.newest is not None:
        persisted = "none" if memory.newest_persisted is None else memory.newest_persisted
        console.print(f"Persisted: up to checkpoint {persisted}; {memory.lag} newer only in "
                      f"memory on {escape(memory.host)} (lost if this node's memory is).")


def newest_rows(rows: list[CheckpointFacts], limit: int | None,
                ) -> tuple[list[CheckpointFacts], list[CheckpointFacts]]:
    """The ``limit`` newest of ``rows`` (by index: indices only grow) in their order, and the
    others (``None``: all of them, none left out)."""
    if limit is None or len(rows) <= limit:
        return rows, []
    order = sorted(range(len(rows)), key=lambda i: rows[i].index)
    kept = set(order[-limit:])
    return ([row for i, row in enumerate(rows) if i in kept],
            [row for i, row in enumerate(rows) if i not in kept])


def _print_status_table(all_rows: list[CheckpointFacts], root: Path, where: str = "in ",
                        rows: int | None = None) -> None:
    # Fits 80 columns: one saver's rows are numbered by index under a title naming the saver;
    # only a root shared by several savers spends a column on full names.
    shown, older = newest_rows(all_rows, rows)
    savers = sorted({row.saver for row in all_rows})
    title = f"Checkpoints {where}{escape(str(root))}"
    if len(savers) == 1:
        title = f"{escape(savers[0])} checkpoints {where}{escape(str(root))}"
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("index" if len(savers) == 1 else "name", no_wrap=True)
    for column in ("step", "epoch", "size", "age"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("state", overflow="fold")
    for row in shown:
        state = row.state + (" (pinned)" if row.pinned and row.state != "pinned" else "")
        if row.problem:
            state += f": {row.problem}"
        style = _STATE_STYLES.get(row.state, "")
        table.add_row(str(row.index) if len(savers) == 1 else escape(row.name),
                      _blank(row.step), _blank(row.epoch), human_size(row.size),
                      human_age(row.age_seconds),
                      f"[{style}]{escape(state)}[/]" if style else escape(state))
    console.print(title)
    console.print(table)
    if older:
        invalid = sum(row.state not in ("latest", "valid", "pinned", "legacy") for row in older)
        console.print(f"... and {len(older)} older checkpoints"
                      + (f" ({invalid} of them not valid)" if invalid else "")
                      + "; cycle status --all lists every one")


def _blank(value: int | None) -> str:
    return "" if value is None else str(value)


def _render_supervisors(supervisors: list[dict[str, Any]]) -> None:
    if not supervisors:
        console.print("Supervisor: none running.")
    for owner in supervisors:
        console.print(f"Supervisor: [green]alive[/], pid {owner.get('pid', '?')} on "
                      f"{escape(str(owner.get('host', '?')))}")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _render_goodput(figures: Goodput | None) -> None:
    if figures is None or figures.goodput is None:
        return
    lost = [(name, getattr(figures, name)) for name in ("starting", "stops", "restarts",
                                                         "hangs", "kills", "queue", "redone")]
    causes = ", ".join(f"{name} {_duration(value)}" for name, value in lost if value >= 0.5)
    ongoing = " so far" if figures.running else ""
    console.print(f"Time{ongoing}: {_duration(figures.wall)} in {counted(figures.runs, 'run')}, "
                  f"{_duration(figures.useful)} of useful "
                  f"training; lost: {causes or 'nothing'}. Goodput {figures.goodput:.1%}.",
                  soft_wrap=True)
    _render_interruptions(figures)


def _render_interruptions(figures: Goodput, shown: int = 5) -> None:
    """The interruptions' count by kind, each one's cost and biggest part, the parts' totals."""
    if not figures.interruptions:
        return
    kinds = ", ".join(counted(figures.count(kind), label) for kind, label in (
        ("stop", "preemption (a stop asked for)/preemptions (stops asked for)"),
        ("failure", "failure"), ("hang", "hang"), ("kill", "kill of the job/kills of the job"))
        if figures.count(kind))
    console.print(f"Interruptions: {kinds}; latest last:")
    for interruption in figures.interruptions[-shown:]:
        when = datetime.datetime.fromtimestamp(interruption.at).strftime("%m-%d %H:%M:%S")
        biggest = interruption.biggest
        most = f", most {biggest[0]} {biggest[1]:.1f} s" if biggest else ""
        so_far = "" if interruption.complete else ", so far"
        console.print(f"  {when} {interruption.kind}: {interruption.lost:.1f} s{most}{so_far}")
    totals = sorted(((name, seconds) for name, seconds in figures.parts().items()
                     if seconds >= 0.05), key=lambda item: -item[1])
    if totals:
        console.print("  in all: " + ", ".join(f"{name} {seconds:.1f} s"
                                                for name, seconds in totals))


def _render_timeline(lines: dict[int, str]) -> None:
    if not lines:
        return
    console.print("Timeline, oldest left:")
    for node, line in lines.items():
        console.print(f"  node {node} |{escape(line)}|", highlight=False)
    console.print(f"  {LEGEND}", style="dim")


def _render_events(events: list[dict[str, Any]], counts: dict[str, int]) -> None:
    if not events:
        return
    summary = ", ".join(f"{name} {count}" for name, count in counts.items())
    console.print(f"History ({summary}), latest last:")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("time", no_wrap=True)
    table.add_column("node", justify="right", no_wrap=True)
    table.add_column("what happened", overflow="fold")
    for event in events:
        when = datetime.datetime.fromtimestamp(float(event.get("time", 0)))
        fields = {key: value for key, value in event.items() if key != "event"}
        table.add_row(when.strftime("%m-%d %H:%M:%S"), escape(str(event.get("node", ""))),
                      escape(describe(str(event.get("event")), fields)))
    console.print(table)


def render_prune(result: PruneResult) -> None:
    if not result.decisions and not result.stale_temporaries:
        console.print("Nothing to prune.")
        return
    verb = "would remove" if result.dry_run else "removed"
    table = Table(title="Prune decisions" + (" (dry run: nothing deleted)" if result.dry_run
                                             else ""), title_justify="left")
    table.add_column("name", no_wrap=True)
    for column in ("state", "decision", "reason"):
        table.add_column(column)
    for decision in result.decisions:
        checkpoint = decision.checkpoint
        action = "[green]keep[/]" if decision.keep else f"[red]{verb}[/]"
        table.add_row(escape(checkpoint.path.name), checkpoint.state.value, action,
                      escape(decision.reason))
    for temporary in result.stale_temporaries:
        table.add_row(escape(temporary.name), "temporary", f"[red]{verb}[/]",
                      "left by a writer that died")
    console.print(table)


def prune_as_dict(result: PruneResult) -> dict[str, Any]:
    return {
        "dry_run": result.dry_run,
        "decisions": [{"name": d.checkpoint.path.name, "state": d.checkpoint.state.value,
                       "keep": d.keep, "reason": d.reason} for d in result.decisions],
        "stale_temporaries": [str(p) for p in result.stale_temporaries],
        "removed": [str(p) for p in result.removed],
    }


@contextlib.contextmanager
def verify_progress(enabled: bool) -> Iterator[tuple[Callable[[str, int, int], None],
                                                     Callable[[int, int], None]]]:
    """A live line per phase of ``cycle verify`` (on stderr), and the callbacks that move it."""
    stderr = Console(stderr=True, highlight=False)
    if not enabled or not stderr.is_terminal:  # a log file gets the summary only
        yield (lambda name, step, kept: None), (lambda done, total: None)
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=stderr, transient=True) as progress:
        tasks: dict[str, Any] = {}

        def task(name: str, text: str) -> None:
            if name not in tasks:
                for other in tasks.values():
                    progress.stop_task(other)
                tasks[name] = progress.add_task(text)
            progress.update(tasks[name], description=text)

        yield ((lambda name, step, kept: task(name, f"{name} run: step {max(step, 0)}, "
                                                    f"{counted(kept, 'checkpoint')} kept")),
               (lambda done, total: task("compare", f"comparing checkpoints: {done}/{total}")))


def render_verify(result: VerifyResult) -> None:
    """The summary table of the runs, then the verdict in a few lines."""
    table = Table(box=box.SIMPLE, title="cycle verify", title_justify="left")
    for column in ("run", "starts", "checkpoints", "interruptions", "seconds",
                   "of which start-up"):
        table.add_column(column, justify="left" if column in ("run", "interruptions") else "right")
    for run in result.runs:
        events = ", ".join(_interruption(r, resumed=run.finished or r is not run.resumes[-1])
                           for r in run.resumes) or "none"
        table.add_row(run.name, str(run.starts), str(len(run.capture.kept)), events,
                      f"{run.seconds:.1f}", f"{run.startup_seconds:.1f}")
    console.print(table)
    after = sum(1 for _, segment, _ in result.compared if segment > 0)
    compared = counted(len(result.compared), "checkpoint")
    console.print(f"compared {compared}: {result.determinism_checked} "
                  f"before the first interruption, {after} after a resume (seed {result.seed})",
                  soft_wrap=True)
    for line in coverage_lines(result):
        console.print(escape(line), soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {escape(note)}", style="yellow", soft_wrap=True)
    for line in verify_lines(result):
        console.print(escape(line), style=_VERDICT_STYLES.get(result.verdict, ""),
                      soft_wrap=True)


_VERDICT_STYLES = {"identical": "bold green", "different": "bold red",
                   "nondeterministic": "bold yellow"}


def _interruption(resume: Resume, resumed: bool) -> str:
    where = f"step {resume.from_step}" if resume.from_step is not None else resume.from_name
    went_on = f"resumed from {where}" if resumed else f"checkpoint at {where}, not resumed"
    planned = resume.interruption
    when = (f"step {resume.sent_at_step}" if resume.sent_at_step >= 0
            else f"commit {planned.after_checkpoints}")
    return f"{planned.kind} at {when}: {went_on}"


def coverage_lines(result: VerifyResult) -> list[str]:
    """How far after the last resume the states were compared, and what was left out."""
    lines = []
    after = result.steps_after_last_resume
    if after is not None and result.first is None:
        lines.append(f"compared up to step {result.last_step_compared}: {after} steps after the "
                     "last resume")
    for why, places in result.skipped.items():
        lines.append(f"skipped (a record, not training state): {', '.join(places)}: {why}")
    return lines


def verify_lines(result: VerifyResult) -> list[str]:
    """The verdict in a few lines: where, what, why, the fix."""
    first = result.first
    if first is None and result.verdict == "different":
        return ["cycle verify: DIFFERENT: every step both runs reached matches, but the "
                "interrupted run ended early (see the note)", f"  runs kept in {result.scratch}"]
    if first is None:
        kept = [f"  runs kept in {result.scratch}"] if result.scratch is not None else []
        return ["cycle verify: IDENTICAL: every checkpoint after each resume matches the "
                "uninterrupted run's, bit for bit", *kept]
    head = first.headline
    largest = first.diff.largest
    lines = [_headline(result, first),
             f"  first difference: {head.where()} ({first.diff.tensors_differing} of "
             f"{first.diff.tensors} tensors differ"
             + (f", largest difference {largest:.3g})" if largest is not None else ")"),
             f"  likely cause: {first.cause.part}: {first.cause.why}",
             f"  fix: {first.cause.fix}"]
    if result.scratch is not None:
        lines.append(f"  runs kept in {result.scratch} (each run's own outputs in "
                     f"<run>/work, its log in <run>/cycle-run.log)")
    return lines


def _headline(result: VerifyResult, first: FirstDifference) -> str:
    if first.resume is None:
        what = "NOT DETERMINISTIC" if result.verdict == "nondeterministic" else "DIFFERENT"
        return (f"cycle verify: {what}: two runs differ at {first.moment}, before any "
                "interruption (no resume is to blame)")
    total = len(result.runs[-1].resumes)
    resume = first.resume
    steps = first.steps_after_resume
    since = (f"{steps} step{'' if steps == 1 else 's'} after the resume from step "
             f"{resume.from_step}"
             if first.steps_after_resume is not None else f"after the resume from "
             f"{resume.from_name}")
    return (f"cycle verify: DIFFERENT at {first.moment}, {since} "
            f"({resume.interruption.kind} {first.interruption} of {total})")
