"""``cycle status`` and ``cycle prune``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add ``status`` and ``prune`` to ``app``."""
