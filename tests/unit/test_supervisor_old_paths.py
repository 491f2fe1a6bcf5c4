"""The supervisor's modules before the wings (issue 37) still import, as the same modules."""

from __future__ import annotations

import importlib

import pytest

from cycler.supervisor import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_imports_the_module_at_its_new_path(old: str) -> None:
    moved = importlib.import_module(f"cycler.supervisor.{old}")
    new = importlib.import_module(f"cycler.supervisor.{MOVED[old]}")
    assert moved is new and moved.__spec__.name == new.__name__


def test_names_imported_from_an_old_path_are_the_new_modules_own() -> None:
    from cycler.supervisor.options import RunOptions as old

    from cycler.supervisor.configuration.options import RunOptions

    assert old is RunOptions
