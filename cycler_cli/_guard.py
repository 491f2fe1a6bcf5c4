"""Refuse, in one line, to run against matplotlib's ``cycler`` (same import name on PyPI)."""

from __future__ import annotations

import importlib
import sys

# cycler.protocol.exit_codes cannot be imported before the package is known to be ours.
EXIT_USAGE = 2


def ensure_torch_cycler() -> None:
    """Exit 2 with one line when the importable ``cycler`` is not torch-cycler."""
    try:
        module = importlib.import_module("cycler")
    except ImportError as error:
        _refuse(f"cannot import cycler ({error}); install it with: pip install torch-cycler")
        return
    if not getattr(module, "IS_TORCH_CYCLER", False):
        where = getattr(module, "__file__", "?")
        _refuse(
            f"the 'cycler' package at {where} is matplotlib's, not torch-cycler; "
            "install cycle in its own virtual environment: pip install torch-cycler"
        )


def _refuse(message: str) -> None:
    sys.stderr.write(f"cycle: error: {message}\n")
    raise SystemExit(EXIT_USAGE)
