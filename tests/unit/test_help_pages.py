"""Every help page of every ``cycle`` command is readable at the widths terminals have: no flag,
no ``$VARIABLE`` is ever cut (with an ellipsis, or at its hyphen across two lines), and one
style says the defaults (issue 33: the third report of ``--determinism-ch…`` at 80 columns)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import typer

from cycler_cli.main import app

GROUP: Any = typer.main.get_command(app)
COMMANDS = [[], *([name] for name in GROUP.commands)]
WIDTHS = [60, 80, 100]
_VARIABLE = re.compile(r"\$[A-Z_][A-Z0-9_]*")


@pytest.fixture
def rendered(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
             ) -> Callable[[list[str], int], str]:
    """``cycle COMMAND --help`` as a terminal of ``columns`` shows it (``$COLUMNS``, which
    typer's test runner would override with 80)."""
    def render(command: list[str], columns: int) -> str:
        monkeypatch.setenv("COLUMNS", str(columns))
        capsys.readouterr()
        assert GROUP.main([*command, "--help"], prog_name="cycle", standalone_mode=False) == 0
        return capsys.readouterr().out
    return render


def declared(command: list[str]) -> Any:
    return GROUP.commands[command[0]] if command else GROUP


def whole(word: str, text: str) -> bool:
    return re.search(rf"(?<![\w$-]){re.escape(word)}(?![\w-])", text) is not None


def texts_of(command: Any) -> str:
    params = " ".join(getattr(p, "help", None) or "" for p in command.params)
    return " ".join([command.help or "", command.epilog or "", params])


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(["cycle", *c]))
def test_every_flag_and_variable_of_a_help_page_is_shown_whole(
        rendered: Callable[[list[str], int], str], command: list[str], columns: int) -> None:
    page = rendered(command, columns)
    assert "…" not in page, page
    names = [name for param in declared(command).params
             for name in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))
             if name.startswith("-")]
    assert names and all(whole(name, page) for name in names), (
        [name for name in names if not whole(name, page)], page)
    variables = set(_VARIABLE.findall(texts_of(declared(command))))
    assert all(whole(variable, page) for variable in variables), (
        [v for v in variables if not whole(v, page)], page)


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(["cycle", *c]))
def test_a_help_page_breaks_lines_between_words_within_the_width(
        rendered: Callable[[list[str], int], str], command: list[str], columns: int) -> None:
    for line in rendered(command, columns).splitlines():
        assert not re.search(r"\w-$", line), f"a word cut at its hyphen: {line!r}"
        assert len(line) <= max(columns, 52) or " " not in line.strip(), line


def test_the_command_list_shows_each_commands_summary_whole(
        rendered: Callable[[list[str], int], str]) -> None:
    page = " ".join(rendered([], 80).split())
    for name, command in GROUP.commands.items():
        assert f"{name} {command.short_help}" in page, page
    assert "..." not in page.split("Commands:")[1]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(["cycle", *c]))
def test_defaults_are_said_in_one_style(rendered: Callable[[list[str], int], str],
                                        command: list[str]) -> None:
    page = rendered(command, 80)
    assert "[default:" not in page and not re.search(r"\[x[<>]", page), page


def test_run_groups_torchruns_own_options_under_their_title(
        rendered: Callable[[list[str], int], str]) -> None:
    page = rendered(["run"], 80)
    title = page.index("torchrun options (passed to torchrun unchanged):")
    assert page.index("--grace") < title < page.index("--rdzv-conf")
