"""``cycle run``: owned by the supervisor work (issue 4); registered by main."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to ``app`` (not yet implemented)."""
