"""The house of ``cycler/``: each part imports only downward."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cycler

PACKAGE = Path(cycler.__file__).parent

ALLOWED = {
    "protocol": set(),
    "data": set(),
    "checkpoint": {"protocol"},
    "training": {"checkpoint", "data", "protocol"},
    "supervisor": {"checkpoint", "protocol"},
    "integrations": {"training", "checkpoint", "data", "protocol"},
    "verify": {"checkpoint", "protocol"},
}
"""Which other parts each part may import (docs/design.md, "Layout of the package"). The helpers
(``_fs``, ``errors``) are below every part; ``errors`` reads the exit codes, a leaf module."""

HELPERS = {"_fs", "_distributed", "_private", "_version", "errors"}


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
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cycler"):
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(named & modules)
            if node.module != "cycler" or named - modules:  # `from cycler import X`: the root
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cycler"))
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


def test_only_the_package_root_imports_the_saver_facade_and_training_only_the_in_flight_saves(
        ) -> None:
    """The integrations sit above every part (they use the saver as a script does)."""
    facade, in_flight = "cycler.checkpoint.atomic_directory", "cycler.checkpoint.in_flight"
    wrong = []
    for module, path in all_modules().items():
        imported = imports_of(path, top_level_only=False)
        if facade in imported and module != "cycler" and part_of(module) != "integrations":
            wrong.append(f"{module} imports the saver's facade: its parts must not know it")
        reached = {m for m in imported if part_of(m) == "checkpoint"}
        if part_of(module) == "training" and reached - {in_flight}:
            wrong.append(f"{module} reaches {sorted(reached - {in_flight})}")
    assert not wrong, "\n".join(wrong)


def test_from_cycler_import_a_name_counts_as_importing_the_package_root(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text("from cycler import __version__\nfrom cycler import _fs\n")
    assert imports_of(source, top_level_only=True) == {"cycler", "cycler._fs"}


def test_the_helpers_import_no_part_but_the_exit_codes() -> None:
    for helper in HELPERS:
        imported = imports_of(PACKAGE / f"{helper}.py", top_level_only=False)
        parts = {m for m in imported if part_of(m) not in HELPERS}
        assert parts <= {"cycler.protocol.exit_codes", "cycler.protocol"}, (helper, parts)
    assert not imports_of(PACKAGE / "protocol" / "exit_codes.py", top_level_only=False)


def assert_no_cycle(graph: dict[str, set[str]]) -> None:
    """Fails naming the first circle of ``graph`` (module -> the modules it imports)."""
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


def test_module_level_imports_have_no_cycle() -> None:
    assert_no_cycle({m: imports_of(p, top_level_only=True) - {m}
                     for m, p in all_modules().items()})


def test_the_protocol_never_imports_torch_at_import_time() -> None:
    for path in (PACKAGE / "protocol").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # the supervisor's start-up path imports these
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torch" for n in names), path


def test_the_core_imports_no_integration_nor_its_stack() -> None:
    stacks = ("transformers", "lightning", "pytorch_lightning", "cycler.integrations")
    wrong = []
    for module, path in all_modules().items():
        if part_of(module) == "integrations":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            wrong += [f"{module} imports {n}" for n in names if n.startswith(stacks)]
    assert not wrong, "\n".join(wrong)


def test_the_library_never_names_the_cli_nor_typer() -> None:
    """The arrow runs cycler_cli -> cycler only, also through a subprocess's command line: a
    library that starts ``python -m cycler_cli`` would need the CLI installed beside it."""
    wrong = []
    for module, path in all_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and len(node.value) < 40 else []
            wrong += [f"{module}: {n}" for n in names if n.split(".")[0] in ("cycler_cli", "typer")]
    assert not wrong, "\n".join(wrong)


def test_the_checkpoint_part_has_no_cycle_even_through_imports_for_types_or_in_functions(
        ) -> None:
    """A circle through ``TYPE_CHECKING`` or a function's import is a circle of the design too
    (commit -> placement -> tiers -> commit was one: the commit's last step now has a module
    of its own, :mod:`cycler.checkpoint.linking`)."""
    modules = {m: p for m, p in all_modules().items() if part_of(m) == "checkpoint"}
    assert_no_cycle({m: {i for i in imports_of(p, top_level_only=False) if i in modules} - {m}
                     for m, p in modules.items()})


def room_of(module: str) -> str:
    """The module's package below a part (``cycler.supervisor.launch``), or the module itself
    where it stands in a part's own folder (``cycler.supervisor.shell``)."""
    pieces = module.split(".")
    return ".".join(pieces[:3]) if len(pieces) > 3 else module


def test_no_two_packages_or_modules_of_a_part_import_each_other_in_a_circle() -> None:
    """The house at the scale of its rooms, every import counted (for types, in functions): a
    circle between two wings of the supervisor, or two modules of one, is a circle too (the
    compile cache's place and archive were one)."""
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        room = room_of(module)
        graph.setdefault(room, set()).update(
            room_of(i) for i in imports_of(path, top_level_only=False)
            if room_of(i) != room and not module.startswith(f"{i}."))  # its own package's face
    assert_no_cycle(graph)
    for room in {room_of(m) for m in modules if room_of(m) != m}:
        inside = {m: p for m, p in modules.items() if room_of(m) == room}
        assert_no_cycle({m: {i for i in imports_of(p, top_level_only=False) if i in inside} - {m}
                         for m, p in inside.items()})


def test_each_package_of_the_supervisor_maps_its_modules_and_packages_in_its_docstring() -> None:
    """``supervisor/`` is in wings: its ``__init__`` and each wing's name every module and
    package they hold (``:mod:`.name```), so a reader finds any module from the top."""
    unnamed = []
    for init in (PACKAGE / "supervisor").rglob("__init__.py"):
        said = ast.get_docstring(ast.parse(init.read_text())) or ""
        held = [p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py"]
        held += [p.parent.name for p in init.parent.glob("*/__init__.py")]
        unnamed += [f"{init.parent.name}/{name}" for name in held if f":mod:`.{name}`" not in said]
    assert not unnamed, unnamed
