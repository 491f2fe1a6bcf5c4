"""Lets torch-cycler and matplotlib's ``cycler`` share the import name ``cycler``.

Installed wheels of torch-cycler ship no ``cycler/__init__.py``: the file that PyPI's ``cycler``
(a dependency of matplotlib) owns. Their package body is ``cycler/_torch_cycler_init.py``
instead, and ``torch_cycler.pth`` imports this module at interpreter start, which puts one
finder before the others for the name ``cycler``. It finds the package as Python would (PyPI's
regular package, or a namespace of our directory when PyPI's is absent), runs that code first,
then runs torch-cycler's body in the same module: PyPI's names (``cycler``, ``Cycler``,
``concat``, and ``__version__``, which matplotlib checks) stay as they are and torch-cycler's are
added beside them (its own version is ``cycler._version.VERSION``). No file is shared, so
either side can be installed, upgraded or uninstalled in any order without touching the other.

A source checkout or an editable install has ``cycler/__init__.py`` and does not need this.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = "cycler"
BODY = "_torch_cycler_init.py"
"""torch-cycler's ``cycler/__init__.py`` as the wheel ships it."""
OURS = Path(__file__).resolve().parent / PACKAGE


class SharedNameFinder(importlib.abc.MetaPathFinder):
    """Finds ``cycler`` as the path finder does and makes its loader add torch-cycler's body."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != PACKAGE or not (OURS / BODY).is_file():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        spec.loader = SharedNameLoader(spec.loader)
        return spec


class SharedNameLoader(importlib.abc.Loader):
    """Runs the package's own code (PyPI's ``cycler``, or none), then torch-cycler's body."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.inner.create_module(spec) if hasattr(self.inner, "create_module") else None

    def exec_module(self, module: ModuleType) -> None:
        if hasattr(self.inner, "exec_module"):
            self.inner.exec_module(module)
        theirs = list(getattr(module, "__all__", ()))
        # matplotlib checks cycler.__version__ at import: PyPI's stays, as does its docstring.
        kept = {key: module.__dict__[key] for key in ("__version__", "__doc__")
                if module.__dict__.get(key) is not None}
        if str(OURS) not in list(module.__path__):
            module.__path__.append(str(OURS))  # PyPI's cycler in another site directory
        body = OURS / BODY
        exec(compile(body.read_bytes(), str(body), "exec"), module.__dict__)
        module.__dict__.update(kept)
        ours = module.__dict__["__all__"]
        module.__dict__["__all__"] = [*theirs, *(name for name in ours if name not in theirs)]


def install() -> None:
    """Put the finder first (once); never raises: this runs at every interpreter start."""
    try:
        if not any(isinstance(finder, SharedNameFinder) for finder in sys.meta_path):
            sys.meta_path.insert(0, SharedNameFinder())
    except Exception:  # a broken hook must not break Python for the whole environment
        pass


install()
