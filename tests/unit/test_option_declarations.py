"""`cycle run`'s options are declared once (RunOptions fields with a Flag) and every other list
of them (the typer options and their help, the config file's keys and types, docs/options.md)
says the same."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer
from typer.testing import CliRunner

from cycler.protocol.exit_codes import MEANINGS
from cycler.supervisor.configuration.flags import declared, help_line
from cycler.supervisor.configuration.options import CONFIG_KEYS, RunOptions, load_config_file
from cycler_cli.main import app
from cycler_cli.options_doc import DOC_PATH, options_markdown

REPOSITORY = Path(__file__).resolve().parents[2]

NOT_FLAGS = {"script", "script_args", "min_nodes", "launch_mode", "torchrun_args",
             "slurm_job_id", "requeue_count"}
"""Fields set another way: SCRIPT and its arguments, --nnodes MIN:MAX, -m/--no-python/
--run-path, torchrun's own options, and Slurm's variables."""


def run_command_options() -> dict[str, object]:
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    return {param.name: param for param in run.params if param.param_type_name == "option"}


def test_every_field_of_run_options_is_a_declared_flag_or_named_as_set_another_way() -> None:
    flagged = {field.name for field, _ in declared(RunOptions)}
    every = {field.name for field in dataclasses.fields(RunOptions)}
    assert flagged | NOT_FLAGS == every
    assert not flagged & NOT_FLAGS


def test_cycle_run_takes_every_declared_flag_with_its_spellings_and_help() -> None:
    options = run_command_options()
    for field, flag in declared(RunOptions):
        param = options[field.name]
        spellings = [*param.opts, *param.secondary_opts]  # type: ignore[attr-defined]
        assert "/".join(spellings) == "/".join(flag.names) or spellings == list(flag.names)
        assert param.help == help_line(field, flag)  # type: ignore[attr-defined]


def test_cycle_run_help_lists_every_option_with_its_help() -> None:
    wide = {"COLUMNS": "400", "TERMINAL_WIDTH": "400"}  # one line per option's help
    shown = CliRunner().invoke(app, ["run", "--help"], env=wide).output
    for field, flag in declared(RunOptions):
        assert flag.names[0].split("/")[0] in shown
        assert flag.help in " ".join(shown.split()), field.name


def test_the_config_file_takes_exactly_the_declared_options_with_their_types() -> None:
    assert set(CONFIG_KEYS) == {field.name for field, _ in declared(RunOptions)}


def test_a_config_file_refuses_a_type_its_option_does_not_declare(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    for field, flag in declared(RunOptions):
        config.write_text(f"{field.name}: {{}}\n")  # a mapping: no option takes one
        try:
            load_config_file(config)
        except Exception as error:  # noqa: BLE001 - the message is what is checked
            assert field.name in str(error) and " or ".join(t.__name__ for t in flag.yaml) \
                in str(error)
        else:
            raise AssertionError(f"{field.name}: a mapping was accepted")


def test_the_memory_tier_help_says_it_works_on_several_nodes() -> None:
    param = run_command_options()["memory_tier"]
    assert "one-node" not in param.help and "several" in param.help  # type: ignore[attr-defined]


def test_docs_options_md_is_generated_from_the_declarations() -> None:
    written = (REPOSITORY / DOC_PATH).read_text()
    assert written == options_markdown(), (
        "docs/options.md is stale: run `python -m cycler_cli.options_doc` at the repository root")


def test_every_exit_code_is_in_the_exit_code_table_of_docs_cycle_run_md() -> None:
    table = (REPOSITORY / "docs" / "cycle-run.md").read_text()
    for code in MEANINGS:
        assert f"\n| {code} | " in table, code
