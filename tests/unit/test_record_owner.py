"""Only cycler/protocol/record.py makes a path under a root's ``.cycler/`` (issue 37).

Read from the source (no import): a module that names the record directory, joins a
``.cycler`` literal or imports a record file's name builds a record path of its own, and the
next change of the layout on disk would miss it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGES = ("cycler", "cycler_cli")
OWNER = "cycler/protocol/record.py"
NAMES = "cycler/protocol/names.py"
"""Where the record's file names are constants (they may be; paths are made by the owner)."""

NAMES_ALLOWED = {
    # The node's runtime directory (not .cycler/) holds the node's control file and progress
    # beacons under the same names as the root's copies: NodeFiles makes those paths.
    "cycler/protocol/node_local.py": {"CONTROL_FILENAME", "PROGRESS_DIRNAME"},
    # A worker finds the control files beside its own ($CYCLER_CONTROL_FILE), in whatever
    # directory that is: a glob of the name, never a path under a root.
    "cycler/protocol/control.py": {"CONTROL_FILENAME", "every_node"},
}


def _modules(repository: Path = REPOSITORY) -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((repository / package).rglob("*.py")):
            relative = path.relative_to(repository).as_posix()
            if relative not in (OWNER, NAMES):
                yield relative, ast.parse(path.read_text(), relative)


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for statement in body:  # a module's, class's or function's, and attribute notes
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    found.add(id(statement.value))
    return found


def _names_a_record_path(text: str) -> bool:
    return text == ".cycler" or text.startswith(".cycler/") or "/.cycler" in text


def record_paths_made_elsewhere(repository: Path = REPOSITORY) -> list[str]:
    """Every place outside the owner that makes a ``.cycler/`` path, as ``module:line what``."""
    found = []
    for module, tree in _modules(repository):
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            where = f"{module}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Name) and node.id == "SUPERVISOR_DIRNAME" or \
                    isinstance(node, ast.Attribute) and node.attr == "SUPERVISOR_DIRNAME":
                found.append(f"{where} uses SUPERVISOR_DIRNAME")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    id(node) not in docstrings and _names_a_record_path(node.value):
                found.append(f"{where} joins the literal {node.value!r}")
            elif isinstance(node, ast.ImportFrom) and node.module == "cycler.protocol.names":
                allowed = NAMES_ALLOWED.get(module, set())
                found += [f"{where} imports {alias.name}" for alias in node.names
                          if alias.name not in allowed]
            elif isinstance(node, ast.ImportFrom) and node.module == "cycler.protocol" and \
                    any(alias.name == "names" for alias in node.names):
                found.append(f"{where} imports cycler.protocol.names")
    return found


def test_no_module_but_the_record_makes_a_path_under_cycler_dir() -> None:
    assert record_paths_made_elsewhere() == []


def test_the_check_finds_a_record_path_joined_by_hand(tmp_path: Path) -> None:
    (tmp_path / "cycler").mkdir()
    (tmp_path / "cycler" / "x.py").write_text(
        '"""A .cycler/ docstring is prose."""\n'
        "from cycler.protocol.names import SUPERVISOR_DIRNAME, EVENTS_FILENAME\n"
        "a = root / SUPERVISOR_DIRNAME\n"
        'b = root / ".cycler" / "x"\n'
        'c = f"{root}/.cycler/events"\n'
        "d = \"the root's .cycler is read-only\"\n")
    assert sorted(record_paths_made_elsewhere(tmp_path)) == [
        "cycler/x.py:2 imports EVENTS_FILENAME", "cycler/x.py:2 imports SUPERVISOR_DIRNAME",
        "cycler/x.py:3 uses SUPERVISOR_DIRNAME", "cycler/x.py:4 joins the literal '.cycler'",
        "cycler/x.py:5 joins the literal '/.cycler/events'"]


def test_every_allowed_module_exists_and_still_needs_its_names() -> None:
    modules = dict(_modules())
    for module, names in NAMES_ALLOWED.items():
        imported = {alias.name for node in ast.walk(modules[module])
                    if isinstance(node, ast.ImportFrom) and node.module == "cycler.protocol.names"
                    for alias in node.names}
        assert imported == names, module
