"""cycler: make PyTorch training survive preemption.

This module only wires the public API together; see README.md for how to use it.
"""

from __future__ import annotations

from cycler.errors import CyclerError
from cycler.exit_codes import EXIT_FAILURE, EXIT_REQUEUE, EXIT_SUCCESS, EXIT_USAGE

__version__ = "0.1.0"
IS_TORCH_CYCLER = True
"""Marker that tells torch-cycler apart from matplotlib's ``cycler`` package of the same name."""

__all__ = [
    "EXIT_FAILURE",
    "EXIT_REQUEUE",
    "EXIT_SUCCESS",
    "EXIT_USAGE",
    "IS_TORCH_CYCLER",
    "CyclerError",
    "__version__",
]
