"""How one of ``cycle run``'s options is declared: a :class:`RunOptions` field whose metadata is
a :class:`Flag` (its flag, the YAML types a ``--config`` file may give, the environment
variables its default comes from, and its help).

Everything else is derived from these declarations, never written again: the typer options of
``cycle run`` and their help, the config file's keys and types, and ``docs/options.md``
(``tests/unit/test_option_declarations.py`` fails when any of them drifts).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

NUMBER = (int, float)
"""The YAML types of an option in seconds or a factor: ``grace: 90`` and ``grace: 90.5``."""


@dataclass(frozen=True)
class Flag:
    """The declaration of one option of ``cycle run`` (the metadata of its field)."""

    names: tuple[str, ...]
    """The flag's spellings, ``--on/--off`` for a switch."""
    kind: type
    """What the flag's value parses as: ``str``, ``int``, ``float``, ``bool`` or a path."""
    help: str
    """One sentence for ``--help`` and the docs, without the default."""
    yaml: tuple[type, ...]
    """The YAML types a ``--config`` file may give for it."""
    env: tuple[str, ...] = ()
    """Environment variables its default comes from, the first one set wins."""
    shown: str | None = None
    """What ``(default: ...)`` says where the field's default is not the whole story
    (``""``: say nothing); ``None``: the variables, then the field's default."""


def option(default: Any, *names: str, help: str, yaml: tuple[type, ...],
           kind: type | None = None, env: Sequence[str] = (), shown: str | None = None) -> Any:
    """A :class:`RunOptions` field declared as a flag; ``kind`` defaults to the first YAML
    type, ``float`` for numbers."""
    parsed = kind or (float if yaml == NUMBER else yaml[0])
    flag = Flag(tuple(names), parsed, help, yaml, tuple(env), shown)
    return dataclasses.field(default=default, metadata={"flag": flag})


def declared(options: type) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of the dataclass ``options`` that are flags, in declaration order."""
    return [(field, field.metadata["flag"]) for field in dataclasses.fields(options)
            if "flag" in field.metadata]


def config_types(options: type) -> dict[str, tuple[type, ...]]:
    """The keys a ``--config`` file may set and the YAML types each takes."""
    return {field.name: flag.yaml for field, flag in declared(options)}


def default_text(field: dataclasses.Field[Any], flag: Flag) -> str:
    """What ``(default: ...)`` says for the option; ``""`` when it says nothing."""
    if flag.shown is not None:
        return flag.shown
    shown = [f"${name}" for name in flag.env]
    if field.default is not None:
        shown.append(_plain(field.default))
    return ", ".join(shown)


def help_line(field: dataclasses.Field[Any], flag: Flag) -> str:
    """The option's help as ``--help`` and the docs show it, its default included."""
    default = default_text(field, flag)
    return f"{flag.help} (default: {default})." if default else f"{flag.help}."


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, os.PathLike):  # a relative default is relative to where cycle runs
        path = os.fspath(value)
        return path if os.path.isabs(path) else os.path.join(".", path)
    return str(value)

