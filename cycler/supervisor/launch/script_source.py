"""What a training script's source says about running it in a forked worker (pure: no imports
of the script, only its syntax tree).

A forked worker starts with torch imported by torchrun's agent. A variable that the script puts
into the environment before its own ``import torch`` (``OMP_NUM_THREADS``, ``TORCH_LOGS``,
``TORCHINDUCTOR_*``, anything torch or a library it loads reads once, at import) is read in a
fresh ``python`` worker and never in a forked one: :func:`environment_set_before_torch` finds
such a write, so that the launcher starts that script's workers fresh. Which variables torch
reads at import, and which only later, is torch's to change from one release to the next: any
write of the environment counts, whatever its name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

READ_LIMIT = 1 << 22
"""The most of a script that is read (4 MiB): a longer "script" is data, not code."""

_WRITING_METHODS = frozenset({"__setitem__", "__delitem__", "setdefault", "update", "pop",
                              "popitem", "clear", "__ior__"})
_WRITING_FUNCTIONS = frozenset({"putenv", "unsetenv", "load_dotenv"})
"""Calls that write the process's environment (``dotenv.load_dotenv`` fills ``os.environ``)."""


@dataclass(frozen=True)
class EnvironmentWrite:
    """One place where a script writes the environment."""

    line: int
    name: str
    """The variable's name where the source spells it (``os.environ["X"] = ...``), else a
    description of the write (``os.environ.update``)."""


def read_source(script: str | Path) -> bytes | None:
    """The script's first :data:`READ_LIMIT` bytes; ``None`` where it cannot be read."""
    try:
        with open(script, "rb") as handle:
            return handle.read(READ_LIMIT)
    except OSError:
        return None


def environment_writes(source: bytes) -> list[EnvironmentWrite]:
    """Every write of the environment in ``source``, wherever it is (module level, a function,
    a branch), in the order of their lines; none for a script that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    aliases = _environ_aliases(tree)
    found = [write for node in ast.walk(tree) for write in _writes_in(node, aliases)]
    return sorted(found, key=lambda write: write.line)


def first_torch_import(source: bytes) -> int | None:
    """The first line that imports torch or one of its modules (``import torch``, ``from
    torch.nn import ...``) as the script's module code runs: in its body or its blocks (``if``,
    ``try``, ``with``, loops), not in a function or a class, whose code runs when called,
    perhaps after a write below it, nor under ``if TYPE_CHECKING:``, which never runs; ``None``
    where none does."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    lines = [node.lineno for node in _module_code(tree.body)
             if isinstance(node, (ast.Import, ast.ImportFrom)) and _imports_torch(node)]
    return min(lines, default=None)


def _module_code(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run with the module's code, blocks included, functions' and
    classes' bodies and ``if TYPE_CHECKING:`` bodies left out."""
    for statement in statements:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield statement
        if isinstance(statement, ast.If) and _is_type_checking(statement.test):
            yield from _module_code(statement.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for block in getattr(statement, field, []):
                inner = block.body if isinstance(block, (ast.ExceptHandler, ast.match_case)) \
                    else [block]
                yield from _module_code(inner)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def environment_set_before_torch(source: bytes) -> EnvironmentWrite | None:
    """The first write of the environment at a line before the script's first import of torch
    (anywhere in the script where it imports torch only through another module, which may
    import it after the write); ``None`` where there is none."""
    torch_line = first_torch_import(source)
    for write in environment_writes(source):
        if torch_line is None or write.line < torch_line:
            return write
    return None


def _imports_torch(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.Import):
        return any(_is_torch(alias.name) for alias in node.names)
    return node.level == 0 and _is_torch(node.module or "")


def _is_torch(module: str) -> bool:
    return module == "torch" or module.startswith("torch.")


def _environ_aliases(tree: ast.AST) -> frozenset[str]:
    """The names bound to ``os.environ`` (``env = os.environ``, ``from os import environ``)."""
    names = {"environ"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_environ(node.value, frozenset(names)):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names.update(alias.asname for alias in node.names
                         if alias.name == "environ" and alias.asname)
    return frozenset(names)


def _is_environ(node: ast.AST, aliases: frozenset[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in aliases


def _writes_in(node: ast.AST, aliases: frozenset[str]) -> list[EnvironmentWrite]:
    targets: list[ast.AST] = []
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    if not isinstance(node, (ast.stmt, ast.expr)):
        return []
    found = [EnvironmentWrite(node.lineno, _key(target))
             for target in targets if isinstance(target, ast.Subscript)
             and _is_environ(target.value, aliases)]
    if isinstance(node, ast.AugAssign) and _is_environ(node.target, aliases):
        found.append(EnvironmentWrite(node.lineno, "os.environ |="))
    if isinstance(node, ast.Call):
        called = node.func
        if isinstance(called, ast.Attribute) and called.attr in _WRITING_METHODS \
                and _is_environ(called.value, aliases):
            key = _key_of_call(node)
            found.append(EnvironmentWrite(node.lineno, key or f"os.environ.{called.attr}"))
        name = called.attr if isinstance(called, ast.Attribute) else \
            called.id if isinstance(called, ast.Name) else ""
        if name in _WRITING_FUNCTIONS:
            key = _key_of_call(node) if name != "load_dotenv" else None
            found.append(EnvironmentWrite(node.lineno, key or name))
    return found


def _key(target: ast.Subscript) -> str:
    key = target.slice
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    return "os.environ[...]"


def _key_of_call(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) \
            and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None
