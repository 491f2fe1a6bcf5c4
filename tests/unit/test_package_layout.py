"""The house of ``cycler/``: each part imports only downward, and old module paths still work."""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

import cycler
from cycler._moved_modules import MOVED

PACKAGE = Path(cycler.__file__).parent

ALLOWED = {
    "protocol": set(),
    "data": set(),
    "checkpoint": {"protocol"},
    "training": {"checkpoint", "data", "protocol"},
    "supervisor": {"checkpoint", "protocol"},
    "verify": {"checkpoint", "protocol"},
}
"""Which other parts each part may import (DESIGN.md, "Layout of the package"). The helpers
(``_fs``, ``errors``) are below every part; ``errors`` reads the exit codes, a leaf module."""

HELPERS = {"_fs", "_distributed", "errors", "_moved_modules"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def imports_of(path: Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cycler"):
            if node.module != "cycler":  # `from cycler import _fs, __version__` reads no part
                found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cycler"))
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {name for name in found if name in modules}


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_every_module_lives_in_a_part_or_is_a_helper() -> None:
    loose = {m for m in all_modules() if m.count(".") == 1 and part_of(m) not in ALLOWED}
    helpers = {f"cycler.{h}" for h in HELPERS}
    assert loose <= helpers, sorted(loose - helpers)


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_each_part_imports_only_the_parts_below_it(part: str) -> None:
    wrong = []
    for module, path in all_modules().items():
        if part_of(module) != part:
            continue
        for imported in imports_of(path, top_level_only=False):
            other = part_of(imported)
            if other not in (part, "__init__") and other not in HELPERS | ALLOWED[part]:
                wrong.append(f"{module} imports {imported}")
            if other == "__init__":
                wrong.append(f"{module} imports the package root (cycler) from inside")
    assert not wrong, "\n".join(wrong)


def test_the_helpers_import_no_part_but_the_exit_codes() -> None:
    for helper in HELPERS - {"_moved_modules"}:
        imported = imports_of(PACKAGE / f"{helper}.py", top_level_only=False)
        parts = {m for m in imported if part_of(m) not in HELPERS}
        assert parts <= {"cycler.protocol.exit_codes", "cycler.protocol"}, (helper, parts)
    assert not imports_of(PACKAGE / "protocol" / "exit_codes.py", top_level_only=False)


def test_module_level_imports_have_no_cycle() -> None:
    graph = {m: imports_of(p, top_level_only=True) - {m} for m, p in all_modules().items()}
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        if state.get(module) == 2:
            return
        assert state.get(module) != 1, " -> ".join([*trail, module])
        state[module] = 1
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*trail, module])
        state[module] = 2

    for module in sorted(graph):
        visit(module, [])


def test_the_protocol_never_imports_torch_at_import_time() -> None:
    for path in (PACKAGE / "protocol").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # the supervisor's start-up path imports these
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torch" for n in names), path


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_warns_and_gives_the_module_at_its_new_path(old: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert any(old in m and MOVED[old] in m for m in messages), messages


def test_from_an_old_path_a_name_is_the_same_object_as_from_cycler() -> None:
    sys.modules.pop("cycler.samplers", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from cycler.samplers import InterruptableDistributedSampler
    assert InterruptableDistributedSampler is cycler.InterruptableDistributedSampler
