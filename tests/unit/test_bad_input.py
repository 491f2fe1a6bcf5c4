"""Issue 19, bad input in one line: each case reproduced as a user would meet it, and each must
end in one clear error (or the value the user meant), never a traceback or a silent misreading."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cycler import (
    InterruptableDistributedGroupedBatchSampler,
    InterruptableDistributedSampler,
    StateMismatch,
)
from cycler.errors import ConfigError
from cycler.supervisor.configuration.options import load_config_file, resolve_run_options
from cycler.supervisor.schedulers.slurm import expand_nodelist
from cycler_cli.main import app

runner = CliRunner()


def config(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "cycle.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_yaml_sexagesimal_and_octal_look_alikes_stay_what_they_say(tmp_path: Path) -> None:
    options = resolve_run_options(script="t.py", config_file=config(
        tmp_path, "nnodes: 1:2\nresume_from: 010\nmaster_addr: head\n"), environ={})
    assert (options.min_nodes, options.nnodes) == (1, 2)
    assert options.resume_from == "010"
    assert load_config_file(config(tmp_path, "grace: 90\nrestart_delay: 0.5\n")) == {
        "grace": 90, "restart_delay": 0.5}


def test_a_binary_config_file_is_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not text"):
        load_config_file(config(tmp_path, b"\x89PNG\r\n\x1a\n\x00\xff\xfe"))


def cycle(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cycler_cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("args", [
    ("-m", "json.nothing_here"),
    ("-m", "no_such_package.train"),
    ("--rdzv-backend", "bogus", "--rdzv-endpoint", "head:29500", "train.py"),
], ids=["missing-submodule", "missing-package", "bogus-rdzv-backend"])
def test_what_torchrun_could_not_start_is_exit_2_before_anything_starts(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    (tmp_path / "train.py").write_text("print('started')\n")
    result = cycle("run", "--checkpoint-dir", str(tmp_path / "ck"), *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "started" not in result.stdout


@pytest.mark.parametrize("nodelist", ["node[a-b]", "node[1-", "node[]", "[1-2]x[", ""])
def test_a_malformed_slurm_nodelist_is_one_config_error_naming_it(nodelist: str) -> None:
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST"):
        expand_nodelist(nodelist)


def sampler() -> InterruptableDistributedSampler:
    return InterruptableDistributedSampler(list(range(100)), num_replicas=2, rank=0, seed=3)


@pytest.mark.parametrize("change", [
    {"num_replicas": 0}, {"num_replicas": -1}, {"num_replicas": "2"}, {"progress": True},
    {"epoch": None}, {"consumed": 1.5},
])
def test_a_damaged_sampler_state_is_a_state_mismatch(change: dict[str, object]) -> None:
    state = {**sampler().state_dict(), **change}
    with pytest.raises(StateMismatch):
        sampler().load_state_dict(state)


@pytest.mark.parametrize("state", [None, [1, 2], "epoch", {"epoch": 0, "progress": True},
                                   {"epoch": [0], "progress": 1}])
def test_a_state_that_is_not_a_samplers_dict_is_a_state_mismatch(state: object) -> None:
    with pytest.raises(StateMismatch):
        sampler().load_state_dict(state)  # type: ignore[arg-type]
    grouped = InterruptableDistributedGroupedBatchSampler(
        list(range(100)), [i % 3 for i in range(100)], batch_size=4, num_replicas=2, rank=0)
    with pytest.raises(StateMismatch):
        grouped.load_state_dict(state)  # type: ignore[arg-type]


def test_malformed_event_lines_never_crash_cycle_status(tmp_path: Path) -> None:
    events = tmp_path / ".cycler" / "events-node0.jsonl"
    events.parent.mkdir()
    lines = ['{"event": "start", "time": 1.0, "script": "t.py", "nproc_per_node": 1, '
             '"nnodes": 1, "node_rank": 0}', '[1, 2]', '"text"', '{"time": "noon"}',
             '{"event": 5, "time": 2}', '{"event": "exit", "time": true}', '\x00\xff',
             '{"event": "exit", "time": 3.0}']
    events.write_text("\n".join(lines) + "\n")
    for extra in ((), ("--json",)):
        result = runner.invoke(app, ["status", str(tmp_path), *extra])
        assert result.exit_code == 0, result.output
    assert json.loads(runner.invoke(app, ["status", str(tmp_path), "--json"]).stdout)[
        "counts"]["starts"] == 1


def test_cycle_version_and_exit_codes_in_every_commands_help() -> None:
    from cycler import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output
    for command in ("run", "status", "prune"):
        assert "Exit codes" in runner.invoke(app, [command, "--help"]).output


def test_cycle_status_of_a_missing_root_exits_1_for_scripts(tmp_path: Path) -> None:
    assert runner.invoke(app, ["status", str(tmp_path / "nowhere"), "--json"]).exit_code == 1
    assert torch  # the CLI never needed torch for this


# --- issue 25's configuration traps: each ends in one line naming the option and the fix -----


def run_error(*arguments: str, script: Path) -> str:
    """``cycle run --dry-run ... SCRIPT``'s one-line error; fails unless it exits 2."""
    result = runner.invoke(app, ["run", "--dry-run", *arguments, str(script)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize(("text", "key", "value"), [
    ("preemption_notices: off\n", "preemption_notices", "off"),
    ("preemption_notices: Off\n", "preemption_notices", "Off"),
    ("hang_detection: off\n", "hang_detection", False),
    ("requeue: yes\n", "requeue", True),
    ("memory_tier: off\n", "memory_tier", False),
    ("memory_tier: on\n", "memory_tier", True),
])
def test_yaml_on_off_yes_no_mean_what_the_option_takes(tmp_path: Path, text: str, key: str,
                                                       value: object) -> None:
    assert load_config_file(config(tmp_path, text)) == {key: value}


@pytest.mark.parametrize("text", ["grace: ~\n", "grace:\n", "memory_tier: null\n",
                                  "resume_from: ~\n"])
def test_a_yaml_null_is_one_line_saying_the_option_has_no_value(tmp_path: Path,
                                                                text: str) -> None:
    key = text.split(":")[0]
    with pytest.raises(ConfigError, match=rf"{key} has no value .*remove the line"):
        load_config_file(config(tmp_path, text))


@pytest.mark.parametrize(("arguments", "fix"), [
    (("--memory-dir", ""), "memory-dir is empty"),
    (("--memory-dir", "  "), "memory-dir is empty"),
    (("--checkpoint-dir", ""), "checkpoint-dir is empty"),
    (("--metadata-endpoint", "http://"), "metadata-endpoint must be an http:// or https:// URL"),
    (("--metadata-endpoint", "http://host:port"), "metadata-endpoint must be an http"),
    (("--metadata-endpoint", "http://[::1"), "metadata-endpoint must be an http"),
    (("--metadata-endpoint", "http://a b"), "metadata-endpoint must be an http"),
    (("--hang-timeout-min", "0"), "hang-timeout-min must be at least 1 second.*"
                                  "--no-hang-detection"),
    (("--hang-timeout-min", "0.2"), "hang-timeout-min must be at least 1 second"),
    (("--hang-first-step", "0"), "hang-first-step must be at least 1 second"),
    (("--hang-pause-timeout", "0"), "hang-pause-timeout must be at least 1 second"),
])
def test_a_configuration_trap_is_one_line_and_exit_2(tmp_path: Path, arguments: tuple[str, ...],
                                                     fix: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert re.search(fix, run_error(*arguments, script=script))


def test_an_empty_memory_tier_in_the_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="memory-tier is empty"):
        resolve_run_options(script="t.py", config_file=config(tmp_path, 'memory_tier: ""\n'),
                            environ={})
