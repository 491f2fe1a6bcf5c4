"""How every ``cycle`` help page is laid out, whatever the terminal's width.

typer's rich tables fit each option into fixed columns and cut what does not fit with an
ellipsis: at 80 columns ``--determinism-ch…`` and ``$SLURM_GPUS_ON_NOD…``, which a user cannot
type. Here the layout is click's plain one (a name too long for its column gets a line of its
own, help text wraps under it) with two changes: text wraps between words only, never inside
one (``--no-python`` and ``$SLURM_JOB_NODELIST`` stay whole, a line may then run long), and
options are grouped under the titles they declare (``rich_help_panel``). Defaults are written
by each option's help, ``(default: 60).``, one style for every command; click's own
``[default: ...]`` and ``[x>=0]`` are not added.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

COLUMN_MAX = 30
"""The widest first column (names); a longer name puts its help on the next line."""


def wrap(text: str, width: int) -> list[str]:
    """``text`` as lines of at most ``width`` characters, broken between words only."""
    return textwrap.wrap(text, max(width, 10), break_long_words=False, break_on_hyphens=False)


# typer's own click (vendored from typer 0.28, the installed click before): taken from typer's
# classes, so that the help's exit is the one typer catches.
_ClickFormatter: Any = typer.Context.formatter_class


class HelpFormatter(_ClickFormatter):
    """click's formatter with text broken between words only (see the module)."""

    def write_text(self, text: str) -> None:
        indent = " " * self.current_indent
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
        for number, paragraph in enumerate(paragraphs):
            if number:
                self.write("\n")
            for line in wrap(paragraph, self.width - self.current_indent):
                self.write(f"{indent}{line}\n")

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = COLUMN_MAX,
                 col_spacing: int = 2) -> None:
        rows = list(rows)
        first = min(max((len(name) for name, _ in rows), default=0), col_max) + col_spacing
        indent = " " * self.current_indent
        for name, text in rows:
            lines = wrap(text, self.width - self.current_indent - first)
            if len(name) > first - col_spacing or not lines:
                self.write(f"{indent}{name}\n")
            else:
                self.write(f"{indent}{name.ljust(first)}{lines.pop(0)}\n")
            for line in lines:
                self.write(f"{indent}{' ' * first}{line}\n")


class Context(typer.Context):
    formatter_class = HelpFormatter


def help_records(params: Sequence[Any], ctx: Any) -> dict[str, list[tuple[str, str]]]:
    """Each parameter's (names, help) under its section title, in declaration order: the
    arguments, the options, then each declared panel's."""
    sections: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
    for param in params:
        record = param.get_help_record(ctx)
        if record is None:
            continue
        text = getattr(param, "help", None) or ""
        if isinstance(param, TyperArgument) and param.required:
            text = f"{text} (required)".strip()
        title = getattr(param, "rich_help_panel", None) or (
            "Arguments" if isinstance(param, TyperArgument) else "Options")
        sections.setdefault(title, []).append((record[0], text))
    return {title: rows for title, rows in sections.items() if rows}


def _format_options(command: Any, ctx: Any, formatter: Any) -> None:
    for title, rows in help_records(command.get_params(ctx), ctx).items():
        with formatter.section(title):
            formatter.write_dl(rows)


class Command(TyperCommand):
    """A ``cycle`` command whose help is laid out by :class:`HelpFormatter`."""

    context_class = Context

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_options(self, ctx, formatter)


class Group(TyperGroup):
    """The ``cycle`` group, laid out as its commands are."""

    context_class = Context

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)

