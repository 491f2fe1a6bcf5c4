"""Write ``docs/options.md``: ``cycle run``'s options as its ``--help`` lists them, with the
``--config`` key and environment variables each one declares
(:mod:`cycler.supervisor.configuration.flags`).

Regenerate after changing an option: ``python -m cycler_cli.options_doc`` (from the repository
root). ``tests/unit/test_option_declarations.py`` fails while the file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from cycler.supervisor.configuration.flags import declared
from cycler.supervisor.configuration.options import RunOptions
from cycler_cli.main import app

DOC_PATH = Path("docs") / "options.md"
"""Where the table goes, relative to the repository root."""

_HEADER = """# `cycle run`'s options

Generated from the declarations in `cycler/supervisor/configuration/options.py` by
`python -m cycler_cli.options_doc`; do not edit by hand. Every option can also be set in a
YAML file given with `--config` under the key shown (dashes or underscores); flags win over the
file, which wins over the environment, which wins over the defaults. In the file, numbers and
booleans are YAML 1.2's: `1:2` and `010` stay text, and so do `on`, `off`, `yes` and `no`, except
for an option that takes a boolean (`hang_detection: off`, `memory_tier: on`); a key with no
value (`~`, `null`, nothing) is refused: remove the line to take the default.
"""


def options_markdown() -> str:
    """The whole of ``docs/options.md``."""
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    flags = {field.name: flag for field, flag in declared(RunOptions)}
    panels: dict[str, list[str]] = {}
    for param in run.params:
        if param.param_type_name == "option":
            panel = getattr(param, "rich_help_panel", None) or "cycle run's own options"
            panels.setdefault(panel, []).append(_row(param, flags.get(param.name or "")))
    text = [_HEADER]
    for panel, rows in panels.items():
        text += [f"\n## {panel}\n",
                 "| flag | `--config` key | environment | what it does |",
                 "| --- | --- | --- | --- |", *rows]
    return "\n".join(text) + "\n"


def _row(param: Any, flag: object) -> str:
    spellings = " / ".join(f"`{name}`" for name in (*param.opts, *param.secondary_opts))
    key = f"`{param.name}`" if flag is not None else ""
    env = ", ".join(f"`{name}`" for name in getattr(flag, "env", ()))
    return f"| {spellings} | {key} | {env} | {_cell(param.help or '')} |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main() -> None:
    """Write the table to ``docs/options.md`` under the current directory."""
    DOC_PATH.parent.mkdir(exist_ok=True)
    DOC_PATH.write_text(options_markdown())
    sys.stdout.write(f"wrote {DOC_PATH}\n")


if __name__ == "__main__":
    main()
