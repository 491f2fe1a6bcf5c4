"""A torchrun command line works with `torchrun` replaced by `cycle run`.

Each case is parsed twice by torchrun's own parser: once as the user wrote it for torchrun, and
once as the command `cycle run --dry-run` prints. Every setting the user gave must come out the
same, except the ones cycle owns on purpose: restarts (the supervisor's on one node; on several,
torchrun's under cycle's budget), and a static multi-node rendezvous, which becomes c10d at the
same address so that torchrun can restart every node's workers together.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser
from typer.testing import CliRunner

from cycler.supervisor.launch.torchrun import RESTART_CEILING
from cycler_cli.main import app

# torchrun's restarts become the supervisor's; the rest must reach torchrun as given.
OWNED_BY_CYCLE = {"max_restarts", "monitor_interval"}

CASES = [
    "--nproc_per_node=2 train.py --lr 0.1",
    "--nproc-per-node 2 train.py",
    "--nproc_per_node 2 --standalone train.py",
    "--standalone --nnodes=1 --nproc-per-node=2 train.py -- --flag",
    "--nproc-per-node=gpu train.py",
    "-m pkg.train --epochs 3",
    "--module pkg.train",
    "--no-python ./run.sh a b",
    "--no_python ./run.sh",
    "--nnodes 1:4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint head:29400 "
    "--rdzv-id job7 train.py",
    "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=head:29400 --rdzv_id=job7 train.py",
    "--nnodes 2 --node_rank 1 --master_addr head --master_port 29511 train.py",
    "--max-restarts 5 train.py",
    "--max_restarts=2 train.py",
    "--log-dir /tmp/logs --tee 3 --redirects 3 train.py",
    "--log_dir=/tmp/logs -t 0:1 -r 1:2 train.py",
    "--local-ranks-filter 0 train.py",
    "--local_ranks_filter=0,1 --role trainer --start-method fork train.py",
    "--rdzv-conf join_timeout=60 --nnodes 1:2 --rdzv-endpoint h:1 train.py",
    pytest.param(
        "--monitor-interval 1 --shutdown-timeout 90 --signals-to-handle SIGTERM,SIGUSR2 train.py",
        marks=pytest.mark.skipif(
            not any("--signals-to-handle" in action.option_strings
                    for action in get_args_parser()._actions),
            reason="this torchrun has no --signals-to-handle (torch 2.10 and newer)")),
]


def torchrun_namespace(arguments: list[str]) -> dict[str, object]:
    return vars(get_args_parser().parse_args(arguments))


def dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> list[str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
    for name in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "SLURM_JOB_ID", "N_PROC"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["run", "--dry-run", *shlex.split(line)])
    assert result.exit_code == 0, result.output
    command = shlex.split(result.stdout.strip().splitlines()[-1])
    assert command[1:3] == ["-m", "cycler.supervisor.launch.launcher"], "torchrun, quiet on stops"
    return [argument for argument in command[3:] if not argument.startswith("--cycle-")]


STATIC_RENDEZVOUS = {"node_rank", "master_addr", "master_port", "rdzv_backend",
                     "rdzv_endpoint", "rdzv_conf"}


@pytest.mark.parametrize("line", CASES)
def test_cycle_run_gives_torchrun_what_the_same_line_gives_torchrun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> None:
    wanted = torchrun_namespace(shlex.split(line))
    produced = torchrun_namespace(dry_run(tmp_path, monkeypatch, line))
    several_nodes = not str(wanted["nnodes"]).endswith(":1") and str(wanted["nnodes"]) != "1"
    assert produced["max_restarts"] == (RESTART_CEILING if several_nodes else 0)
    owned = set(OWNED_BY_CYCLE)
    if several_nodes and wanted["rdzv_backend"] == "static" and not wanted["rdzv_endpoint"]:
        owned |= STATIC_RENDEZVOUS
        assert produced["rdzv_backend"] == "c10d"
        assert produced["rdzv_endpoint"] == f"{wanted['master_addr']}:{wanted['master_port']}"
    for name, value in wanted.items():
        if name in owned or value == get_args_parser().get_default(name):
            continue
        assert produced[name] == value, f"{name}: torchrun got {produced[name]!r}"
    if "--monitor-interval" in line:
        assert produced["monitor_interval"] == wanted["monitor_interval"], "the user's wins"


def test_a_one_node_run_without_rendezvous_options_is_standalone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert torchrun_namespace(dry_run(tmp_path, monkeypatch, "train.py"))["standalone"]


@pytest.mark.parametrize(("line", "message"), [
    ("--nproc_per_node=two train.py", "nproc-per-node must be a number"),
    ("--nnodes 1:x train.py", "nnodes must be N or MIN:MAX"),
    ("--standalone --nnodes 2 train.py", "standalone runs one node"),
    ("--frobnicate train.py", "cycle run has no option --frobnicate"),
    ("--run-path train.py", "--run-path needs an absolute script path"),
    ("-m no_such_package.train", "module no_such_package.train cannot be found"),
])
def test_a_bad_torchrun_option_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    result = CliRunner().invoke(app, ["run", "--dry-run", *shlex.split(line)])
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_workers_see_the_isc_artifact_paths_unless_the_user_set_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    for name in ("CHECKPOINT_ARTIFACT_PATH", "LOSSY_ARTIFACT_PATH", "CYCLER_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    shown = CliRunner().invoke(app, ["run", "--dry-run", "--checkpoint-dir", "ck", "train.py"])
    assert f"CHECKPOINT_ARTIFACT_PATH={tmp_path / 'ck'}\n" in shown.stdout
    assert "LOSSY_ARTIFACT_PATH" not in shown.stdout  # off ISC nothing is made beside the root
    monkeypatch.setenv("CHECKPOINT_ARTIFACT_PATH", str(tmp_path / "isc"))
    shown = CliRunner().invoke(app, ["run", "--dry-run", "train.py"])
    assert f"LOSSY_ARTIFACT_PATH={tmp_path / 'isc-lossy'}\n" in shown.stdout
    monkeypatch.setenv("LOSSY_ARTIFACT_PATH", "/mine")
    shown = CliRunner().invoke(app, ["run", "--dry-run", "train.py"])
    assert "LOSSY_ARTIFACT_PATH" not in shown.stdout
