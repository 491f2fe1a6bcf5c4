"""The documentation holds together: every relative link and anchor resolves, every ``cycler``
name it uses exists, and README's two commands are the ones CI runs."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import cycler

REPOSITORY = Path(__file__).resolve().parents[2]
README = REPOSITORY / "README.md"


def documents(root: Path = REPOSITORY) -> list[Path]:
    """The pages whose links and names are checked."""
    fixed = [root / "README.md", root / "CONTRIBUTING.md", root / "benchmarks" / "README.md"]
    return [page for page in fixed if page.exists()] + sorted((root / "docs").glob("*.md"))


FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]*`")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_and_code(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The lines outside fenced code blocks, and each block as (its language, its text)."""
    prose: list[str] = []
    blocks: list[tuple[str, str]] = []
    fence: list[str] | None = None
    language = ""
    for line in text.splitlines():
        if FENCE.match(line):
            if fence is None:
                fence, language = [], line.strip().strip("`~").strip().lower()
            else:
                blocks.append((language, "\n".join(fence)))
                fence = None
        elif fence is not None:
            fence.append(line)
        else:
            prose.append(line)
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, each
    space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on ``page``, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_and_code(page.read_text())[0]:
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> Iterator[str]:
    """The targets of the page's markdown links (inline and reference definitions), outside
    code."""
    for line in prose_and_code(page.read_text())[0]:
        yield from LINK.findall(INLINE_CODE.sub("", line))
        yield from DEFINITION.findall(line)


def broken_links(page: Path, root: Path = REPOSITORY) -> list[str]:
    """Each relative link of ``page`` whose file or ``#anchor`` does not exist in the
    repository at ``root``, as a sentence (a leading ``/`` is the repository's root, as on
    GitHub)."""
    broken = []
    for target in links(page):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        base = root if path.startswith("/") else page.parent
        resolved = (base / path.lstrip("/")).resolve() if path else page
        if not resolved.is_relative_to(root.resolve()):
            broken.append(f"{page.name}: {target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{page.name}: {target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{page.name}: {target}: no such heading in {resolved.name}")
    return broken


IMPORT = re.compile(r"from\s+(cycler(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]+)")
ATTRIBUTE = re.compile(r"(?<![\w.])cycler(?:\.\w+)+")


def cycler_names(page: Path) -> set[str]:
    """The dotted ``cycler`` names the page's Python blocks import or use, and those written
    alone in inline code (``cycler.errors.UnsupportedTorch``)."""
    prose, blocks = prose_and_code(page.read_text())
    names: set[str] = set()
    for language, code in blocks:
        if language not in ("python", "py"):
            continue
        for module, imported in IMPORT.findall(code):
            for name in re.split(r"[\s,()]+", re.sub(r"#[^\n]*", "", imported)):
                if name and name != "as":
                    names.add(f"{module}.{name}")
        names.update(ATTRIBUTE.findall(IMPORT.sub("", code)))
    for line in prose:
        names.update(span.strip("`") for span in INLINE_CODE.findall(line)
                     if re.fullmatch(r"`cycler(\.\w+)+`", span))
    return names


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` (``cycler.X.Y``) names an attribute or a module that exists."""
    current: object = cycler
    path = "cycler"
    for part in dotted.split(".")[1:]:
        path = f"{path}.{part}"
        if hasattr(current, part):
            current = getattr(current, part)
            continue
        try:
            current = importlib.import_module(path)
        except ImportError as error:
            if error.name is None or error.name.split(".")[0] == "cycler":
                return False
            # An optional extra that is not installed (transformers, lightning): the name must
            # still be defined at the top of the module's source.
            rest = dotted[len(path) + 1:].split(".")[0] if len(dotted) > len(path) else ""
            return defined_in_source(path, rest)
    return True


def defined_in_source(module: str, name: str) -> bool:
    """Whether ``module``'s source (not executed) exists and defines ``name`` at its top."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return False
    if not name:
        return True
    tree = ast.parse(Path(spec.origin).read_text())
    defined = {node.name for node in tree.body
               if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)}
    defined |= {target.id for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)}
    return name in defined


def quickstart_commands() -> list[str]:
    """The commands of README's Quickstart: its bash blocks, one command each."""
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [code.strip() for language, code in prose_and_code(section)[1] if language == "bash"]


@pytest.mark.parametrize("page", documents(), ids=lambda page: str(page.relative_to(REPOSITORY)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", documents(), ids=lambda page: str(page.relative_to(REPOSITORY)))
def test_every_cycler_name_the_docs_use_exists(page: Path) -> None:
    assert sorted(name for name in cycler_names(page) if not resolves(name)) == []


def test_the_readme_gives_two_commands_and_ci_runs_both_verbatim() -> None:
    commands = quickstart_commands()
    ci = [line.strip() for line in (REPOSITORY / ".ci" / "run").read_text().splitlines()]
    assert len(commands) == 2 and all("\n" not in command for command in commands), commands
    assert [command for command in commands if command not in ci] == []
    assert any(command.endswith("python -m pytest") for command in commands)


def test_the_readme_stays_a_first_page_under_200_lines() -> None:
    assert len(README.read_text().splitlines()) < 200


def test_the_docs_index_lists_every_page() -> None:
    index = REPOSITORY / "docs" / "README.md"
    listed = {(index.parent / target).resolve() for target in links(index)}
    pages = set((REPOSITORY / "docs").glob("*.md")) - {index}
    assert sorted(page.name for page in pages if page.resolve() not in listed) == []


def test_a_missing_file_a_missing_anchor_and_a_link_out_of_the_repository_are_reported(
        tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    (tmp_path / "outside.md").write_text("# Outside\n")
    (repository / "other.md").write_text("# A heading: `with code`\n\n## Twice\n\n## Twice\n")
    page = repository / "page.md"
    page.write_text("[ok](other.md#a-heading-with-code) [ok](other.md#twice-1) [ok](#own)\n"
                    "# Own\n[gone](missing.md) [no anchor](other.md#nowhere)\n"
                    "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n"
                    "[ok](/other.md \"title\") [up](../outside.md) [ref][r]\n"
                    "[r]: gone-too.md\n")
    assert broken_links(page, root=repository) == [
        "page.md: missing.md: no such file",
        "page.md: other.md#nowhere: no such heading in other.md",
        "page.md: ../outside.md: outside the repository",
        "page.md: gone-too.md: no such file"]


def test_a_name_cycler_does_not_have_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nfrom cycler import (StepControl,\n    NoSuchThing)\n"
                    "from cycler.data.samplers import InterruptableSampler\n"
                    "cycler.samplers.InterruptableSampler\n```\n`cycler.errors.DiskFull`\n")
    names = cycler_names(page)
    assert sorted(name for name in names if not resolves(name)) == [
        "cycler.NoSuchThing", "cycler.samplers.InterruptableSampler"]
    assert {"cycler.StepControl", "cycler.errors.DiskFull"} <= names


CITATION = re.compile(r"(docs/design\.md|STYLE\.md|DESIGN\.md)"
                      r"((?:,\s*\"[^\"]+\"(?:\s+and\s+\"[^\"]+\")?)?)")


def test_every_citation_of_the_design_in_the_code_names_a_file_and_section_that_exist() -> None:
    design = (REPOSITORY / "docs" / "design.md").read_text()
    sections = {line.lstrip("#").strip() for line in design.splitlines() if line.startswith("#")}
    cited: list[str] = []
    here = Path(__file__).resolve()
    for path in sorted([*REPOSITORY.glob("cycler/**/*.py"), *REPOSITORY.glob("cycler_cli/*.py"),
                        *REPOSITORY.glob("tests/**/*.py")]):
        if path.resolve() == here:
            continue
        # A citation's section may wrap onto the next line of a docstring.
        text = re.sub(r"\s+", " ", path.read_text())
        for match in CITATION.finditer(text):
            where = f"{path.relative_to(REPOSITORY)}: {match.group(0)}"
            assert match.group(1) != "DESIGN.md", f"{where}: the design is docs/design.md"
            assert (REPOSITORY / match.group(1)).is_file(), where
            for section in re.findall(r"\"([^\"]+)\"", match.group(2)):
                assert any(s.startswith(section) for s in sections), f"{where}: no such section"
            cited.append(where)
    assert len(cited) >= 10
