"""cycle run options: validation, config file, Slurm/ISC defaults, the torchrun command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cycler.errors import ConfigError
from cycler.protocol.environment import (
    ENV_CHECKPOINT_DIR,
    ENV_CONTROL_FILE,
    ENV_MEMORY_TIER,
    ENV_NODE_DIR,
    ENV_PROGRESS_DIR,
    ENV_RESTART_COUNT,
    ENV_RESUME_FROM,
)
from cycler.supervisor.configuration.options import (
    RunOptions,
    load_config_file,
    parse_signals,
    resolve_run_options,
)
from cycler.supervisor.launch.torchrun import (
    fork_preloads,
    full_environment,
    launch_plan,
    torchrun_command,
    worker_environment,
)
from cycler.supervisor.schedulers.slurm import expand_nodelist

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "3", "SLURM_NODEID": "2",
         "SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_RESTART_COUNT": "4"}
ISC = {"NNODES": "2", "N_PROC": "8", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5",
       "MASTER_PORT": "7777"}


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cycle.yaml"
    path.write_text(text)
    return path


# --- Slurm's host lists -----------------------------------------------------------------------


@pytest.mark.parametrize(("nodelist", "hosts"), [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]),
    ("gpu[9-11]", ["gpu9", "gpu10", "gpu11"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("x[001-002],y5", ["x001", "x002", "y5"]),
])
def test_slurm_nodelists_expand_to_hosts_in_order(nodelist: str, hosts: list[str]):
    assert expand_nodelist(nodelist) == hosts


# --- defaults from the scheduler --------------------------------------------------------------


def test_slurm_sets_nodes_rank_first_host_and_a_port_derived_from_the_job_id():
    options = resolve_run_options(script="train.py", environ=SLURM)
    assert (options.nnodes, options.node_rank, options.master_addr) == (3, 2, "gpu07")
    assert options.master_port == 20000 + 4242
    assert options.requeue and options.slurm_job_id == "4242" and options.requeue_count == 4


def test_isc_variables_set_nodes_processes_rank_and_master():
    options = resolve_run_options(script="train.py", environ=ISC)
    assert (options.nnodes, options.nproc_per_node, options.node_rank) == (2, 8, 1)
    assert (options.master_addr, options.master_port) == ("10.0.0.5", 7777)
    assert not options.requeue, "requeue defaults on only under Slurm"


def test_isc_without_node_rank_takes_the_node_rank_from_rank():
    environ = {key: value for key, value in ISC.items() if key != "NODE_RANK"}
    assert resolve_run_options(script="train.py", environ={**environ, "RANK": "1"}).node_rank == 1
    inside_a_worker = {**environ, "RANK": "5", "LOCAL_RANK": "1"}
    assert resolve_run_options(script="train.py", environ=inside_a_worker).node_rank == 0


def test_a_single_node_ignores_rendezvous_variables_and_runs_standalone():
    environ = {**SLURM, "SLURM_NNODES": "1", "SLURM_NODEID": "0"}
    options = resolve_run_options(script="train.py", environ=environ)
    assert options.master_addr is None and options.master_port is None
    assert "--standalone" in torchrun_command(options)


def test_checkpoint_dir_defaults_to_the_isc_artifact_path():
    environ = {"CHECKPOINT_ARTIFACT_PATH": "/artifacts/ckpt"}
    assert resolve_run_options(script="t.py", environ=environ).checkpoint_dir == Path(
        "/artifacts/ckpt")


def test_a_malformed_scheduler_variable_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="SLURM_NNODES"):
        resolve_run_options(script="t.py", environ={"SLURM_NNODES": "many"})


# --- precedence and the config file -----------------------------------------------------------


def test_flags_win_over_the_file_which_wins_over_the_environment(tmp_path: Path):
    config = write_config(tmp_path, "grace: 12\nmax-restarts: 7\nnode_rank: 1\n")
    options = resolve_run_options(script="t.py", flags={"grace": 3.0, "max_restarts": None},
                                  config_file=config, environ=SLURM)
    assert options.grace == 3.0, "the flag wins"
    assert options.max_restarts == 7, "the file fills what no flag gave"
    assert options.node_rank == 1, "the file wins over SLURM_NODEID"
    assert options.nnodes == 3, "the environment fills the rest"


def test_a_config_file_accepts_dashes_and_underscores_and_signal_lists(tmp_path: Path):
    config = write_config(tmp_path, "nproc-per-node: 4\ncheckpoint_dir: /ck\n"
                          "signals: [TERM, usr1]\nrequeue: false\nresume-from: 3\n")
    loaded = load_config_file(config)
    assert loaded == {"nproc_per_node": 4, "checkpoint_dir": "/ck", "signals": ["TERM", "usr1"],
                      "requeue": False, "resume_from": "3"}
    options = resolve_run_options(script="t.py", config_file=config, environ={})
    assert options.signals == ("SIGTERM", "SIGUSR1") and options.resume_from == "3"


def test_an_unknown_config_key_names_the_key_and_the_file(tmp_path: Path):
    config = write_config(tmp_path, "grase: 10\n")
    with pytest.raises(ConfigError, match=r"cycle\.yaml.*unknown key 'grase'"):
        load_config_file(config)


@pytest.mark.parametrize("text", ["grace: soon\n", "nnodes: 2.5\n", "max_restarts: true\n",
                                  "requeue: 1\n", "signals: 15\n"])
def test_a_wrong_type_in_the_config_file_names_the_key_and_the_file(tmp_path: Path, text: str):
    config = write_config(tmp_path, text)
    key = text.split(":")[0]
    with pytest.raises(ConfigError, match=rf"cycle\.yaml: {key} must be"):
        load_config_file(config)


@pytest.mark.parametrize("text", ["- grace\n", "grace: [1\n"])
def test_a_config_file_that_is_not_a_yaml_mapping_is_refused(tmp_path: Path, text: str):
    with pytest.raises(ConfigError, match=r"cycle\.yaml"):
        load_config_file(write_config(tmp_path, text))


def test_a_missing_config_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config_file(tmp_path / "nope.yaml")


def test_an_empty_config_file_sets_nothing(tmp_path: Path):
    assert load_config_file(write_config(tmp_path, "")) == {}


def test_a_value_from_the_file_is_validated_like_a_flag(tmp_path: Path):
    config = write_config(tmp_path, "grace: 0\n")
    with pytest.raises(ConfigError, match="grace must be a finite number of seconds above 0"):
        resolve_run_options(script="t.py", config_file=config, environ={})


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "message"), [
    ("grace", 0.0, "grace must be a finite number of seconds above 0"),
    ("grace", -5.0, "grace must be a finite number of seconds above 0"),
    ("nproc_per_node", 0, "nproc-per-node must be a number of at least 1"),
    ("nnodes", 0, "nnodes must be at least 1"),
    ("node_rank", 1, "node-rank must be between 0 and nnodes - 1"),
    ("max_restarts", -1, "max-restarts must be 0 or more"),
    ("max_requeues", -1, "max-requeues must be 0 or more"),
    ("restart_delay", -1.0, "restart-delay must be a finite number of seconds, 0 or more"),
    ("start_timeout", 0.0, "start-timeout must be a finite number of seconds above 0"),
    ("start_timeout", float("inf"), "start-timeout must be a finite number of seconds above 0"),
    ("master_port", 70000, "master-port must be between 1 and 65535"),
    ("checkpoint_name", "a/b", "checkpoint-name must be a plain file name"),
    ("signals", ("KILL",), "not a signal the supervisor can use"),
])
def test_a_bad_value_names_the_field_and_the_fix(field: str, value: object, message: str):
    with pytest.raises(ConfigError, match=message):
        RunOptions(script=Path("t.py"), **{field: value})  # type: ignore[arg-type]


def test_several_nodes_need_a_master_address_or_rendezvous_endpoint():
    with pytest.raises(ConfigError, match="master-addr is needed when nnodes > 1"):
        RunOptions(script=Path("t.py"), nnodes=2)
    RunOptions(script=Path("t.py"), nnodes=2, rdzv_endpoint="head:29400")


def test_master_address_and_rendezvous_endpoint_exclude_each_other():
    with pytest.raises(ConfigError, match="rdzv-endpoint cannot be combined"):
        RunOptions(script=Path("t.py"), master_addr="a", rdzv_endpoint="b:1")


def test_signal_names_are_accepted_with_or_without_sig_and_in_any_case():
    assert parse_signals("term, SIGINT,hup,term") == ("SIGTERM", "SIGINT", "SIGHUP")
    with pytest.raises(ConfigError):
        parse_signals("SIGCONT")
    with pytest.raises(ConfigError):
        parse_signals("")


# --- what torchrun is given -------------------------------------------------------------------


def test_the_torchrun_command_never_restarts_and_passes_script_arguments_untouched():
    options = RunOptions(script=Path("train.py"), nproc_per_node=2,
                         script_args=("--grace", "1", "--lr=0.1", "--"))
    command = torchrun_command(options, python="py")
    assert command[:3] == ["py", "-m", "cycler.supervisor.launch.launcher"]
    assert command[command.index("--max-restarts") + 1] == "0", "one node: the supervisor's"
    assert command[command.index("--nproc-per-node") + 1] == "2"
    assert command[-5:] == ["train.py", "--grace", "1", "--lr=0.1", "--"]


def test_multi_node_commands_meet_in_a_c10d_rendezvous_hosted_by_node_0_at_the_master():
    def command(node_rank: int, *extra: str, start_timeout: float = 600.0) -> str:
        return " ".join(torchrun_command(RunOptions(
            script=Path("t.py"), nnodes=2, node_rank=node_rank, master_addr="head",
            master_port=1234, torchrun_args=extra, start_timeout=start_timeout), python="py"))

    expected = " --rdzv-backend c10d --rdzv-endpoint head:1234 --rdzv-id cycler --rdzv-conf "
    assert expected + "is_host=0,join_timeout=630 t.py" in command(1)
    assert expected + "is_host=1,join_timeout=630 t.py" in command(0)
    assert "is_host=1,join_timeout=70 " in command(0, start_timeout=40.0), "30 s beyond ours"
    assert "is_host" not in command(0, "--rdzv-conf=join_timeout=30"), "the user's conf wins"
    ipv6 = torchrun_command(RunOptions(script=Path("t.py"), nnodes=2, master_addr="fd00::1"))
    assert ipv6[ipv6.index("--rdzv-endpoint") + 1] == "[fd00::1]:29500"
    dynamic = torchrun_command(RunOptions(script=Path("t.py"), nnodes=2,
                                          rdzv_endpoint="head:29400", slurm_job_id="77"),
                               python="py")
    assert " --rdzv-backend c10d --rdzv-endpoint head:29400 --rdzv-id 77 " in " ".join(dynamic)


def test_with_several_nodes_torchrun_restarts_and_the_launcher_carries_cycles_budget():
    command = torchrun_command(RunOptions(script=Path("t.py"), nnodes=2, node_rank=1,
                                          master_addr="head", max_restarts=5,
                                          checkpoint_dir=Path("/ck")), python="py")
    assert command[3:9] == ["--cycle-restarts=5", "--cycle-checkpoints=/ck",
                            "--cycle-checkpoint-name=AtomicDirectory", "--cycle-restart-delay=1",
                            "--cycle-node-rank=1", "--cycle-fixed-nodes=2"]
    assert int(command[command.index("--max-restarts") + 1]) >= 1000, "the budget decides"


def test_workers_get_the_control_file_on_the_node_an_absolute_root_and_the_restart_count(
        tmp_path: Path):
    options = RunOptions(script=Path("t.py"), checkpoint_dir=Path("rel/ck"), node_rank=1,
                         nnodes=2, master_addr="h", requeue_count=3, grace=45.5,
                         memory_tier=True, memory_dir=tmp_path / "shm")
    environment = worker_environment(options, start_number=2, resume_from=None)
    root = Path.cwd() / "rel" / "ck"
    assert environment[ENV_CHECKPOINT_DIR] == str(root)
    node = Path(environment[ENV_NODE_DIR])
    assert node.parent == tmp_path / "shm" / f"cycler-{os.geteuid()}-run", "beside the tier's"
    assert node.name.startswith("ck-") and node.name.endswith("-node1")
    assert environment[ENV_CONTROL_FILE] == str(node / "control-node1.json")
    assert environment[ENV_PROGRESS_DIR] == str(node / "progress-node1")
    assert environment[ENV_RESTART_COUNT] == "5", "requeues (3) plus local starts before (2)"
    assert ENV_RESUME_FROM not in environment
    assert int(environment["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) > 45.5


def test_resume_from_goes_to_the_first_start_and_an_inherited_one_is_dropped():
    options = RunOptions(script=Path("t.py"), resume_from="AtomicDirectory_checkpoint_2")
    first = launch_plan(options)
    assert first.environment[ENV_RESUME_FROM] == "AtomicDirectory_checkpoint_2"
    later = launch_plan(options, start_number=1)
    assert ENV_RESUME_FROM not in full_environment(later, {ENV_RESUME_FROM: "stale", "A": "1"})
    assert full_environment(later, {"A": "1"})["A"] == "1"


def test_a_config_file_takes_torchrun_spellings_of_the_new_options(tmp_path: Path):
    config = write_config(tmp_path, "nnodes: '1:3'\nrdzv_endpoint: head:29400\n"
                                    "rdzv-backend: c10d\nrdzv_id: 42\nnproc_per_node: gpu\n")
    options = resolve_run_options(script="t.py", config_file=config)
    assert (options.min_nodes, options.nnodes, options.rdzv_id) == (1, 3, "42")
    assert options.nproc_per_node == "gpu"
    command = " ".join(torchrun_command(options, python="py"))
    assert "--nnodes 1:3 " in command and "--rdzv-id 42 " in command


def test_standalone_ignores_the_schedulers_node_count_but_not_a_given_one():
    options = resolve_run_options(script="t.py", flags={"standalone": True}, environ=SLURM)
    assert options.nnodes == 1 and "--standalone" in torchrun_command(options)
    with pytest.raises(ConfigError, match="standalone runs one node"):
        resolve_run_options(script="t.py", flags={"standalone": True, "nnodes": "2"})


# --- the memory tier --------------------------------------------------------------------------


def test_the_memory_tier_reaches_one_nodes_workers_with_its_persist_interval(
        tmp_path: Path) -> None:
    from cycler.checkpoint.memory_roots import memory_base, memory_root
    from cycler.protocol.environment import ENV_PERSIST_EVERY

    options = resolve_run_options(script="train.py", environ={},
                                  flags={"memory_tier": True, "persist_every": 7,
                                         "checkpoint_dir": tmp_path / "ck"})
    assert options.memory_tier and options.memory_dir is None
    assert options.memory_layout is not None
    assert options.memory_layout.root == memory_root(memory_base(), tmp_path / "ck")
    env = worker_environment(options, start_number=0, resume_from=None, environ={})
    # The job's memory root, computed once by cycle run: the workers take it as it is.
    assert env[ENV_MEMORY_TIER] == str(options.memory_layout.root)
    assert env[ENV_PERSIST_EVERY] == "7"
    off = resolve_run_options(script="train.py", environ={}, flags={})
    assert ENV_MEMORY_TIER not in worker_environment(off, start_number=0, resume_from=None,
                                                     environ={})


def test_the_memory_tier_reaches_the_workers_of_every_node() -> None:
    options = resolve_run_options(script="train.py", environ=ISC, flags={"memory_tier": True})
    assert options.nnodes == 2 and options.memory_layout is not None
    env = worker_environment(options, start_number=0, resume_from=None, environ={})
    assert env[ENV_MEMORY_TIER] == str(options.memory_layout.root)


@pytest.mark.parametrize(("text", "on", "directory"), [
    ("memory_tier: true", True, None), ("memory-tier: /mnt/ram", True, "/mnt/ram"),
    ("memory_dir: /mnt/ram", True, "/mnt/ram"), ("memory_tier: false", False, None),
    ("memory_tier: false\nmemory_dir: /mnt/ram", False, "/mnt/ram")])
def test_the_config_file_turns_the_memory_tier_on_or_points_it(
        tmp_path: Path, text: str, on: bool, directory: str | None) -> None:
    options = resolve_run_options(script="train.py", environ={},
                                  config_file=write_config(tmp_path, text))
    assert options.memory_tier is on and (options.memory_layout is not None) is on
    assert options.memory_dir == (None if directory is None else Path(directory))


def dry_run_environment(tmp_path: Path, *arguments: str) -> dict[str, str]:
    """The workers' environment ``cycle run --dry-run ARGUMENTS`` prints (it creates nothing)."""
    from typer.testing import CliRunner

    from cycler_cli.main import app

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    result = CliRunner().invoke(app, ["run", "--dry-run", "--checkpoint-dir",
                                      str(tmp_path / "ck"), *arguments, str(script)])
    assert result.exit_code == 0, result.output
    pairs = (line.split("=", 1) for line in result.output.splitlines())
    return {name: value for name, value in pairs if name.isupper()}


def private_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int = 0o700,
                        ) -> Path:
    """A ``$XDG_RUNTIME_DIR`` of ``mode`` (0700: private, so the default place to take)."""
    runtime = tmp_path / "run-user"
    runtime.mkdir()
    runtime.chmod(mode)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


@pytest.mark.parametrize("where", [
    ("--memory-dir", "/dev/shm"), ("--memory-dir=/dev/shm",), ("--memory-dir", "{ram}"),
    ("--config", "{config}")])
def test_a_memory_dir_given_reaches_the_workers_as_given_even_the_default_dev_shm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: tuple[str, ...]) -> None:
    # Issue 37: --memory-dir /dev/shm was taken for "not given" and replaced by a private
    # $XDG_RUNTIME_DIR, contrary to docs/memory-tier.md.
    private_runtime_dir(tmp_path, monkeypatch)
    ram = tmp_path / "ram"
    config = write_config(tmp_path, "memory_dir: /dev/shm\n")
    arguments = [part.format(ram=ram, config=config) for part in where]
    given = ram if str(ram) in arguments else Path("/dev/shm")
    env = dry_run_environment(tmp_path, *arguments)
    uid = os.geteuid()
    assert Path(env[ENV_MEMORY_TIER]).parent == given / f"cycler-{uid}"
    assert Path(env[ENV_NODE_DIR]).parent == given / f"cycler-{uid}-run"


def test_without_a_memory_dir_the_memory_tier_is_in_a_private_xdg_runtime_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = private_runtime_dir(tmp_path, monkeypatch)
    for arguments in (["--memory-tier"], ["--config", str(write_config(
            tmp_path, "memory_tier: on\n"))]):
        env = dry_run_environment(tmp_path, *arguments)
        assert Path(env[ENV_MEMORY_TIER]).parent == runtime / "cycler"
        assert Path(env[ENV_NODE_DIR]).parent == runtime / "cycler-run"


@pytest.mark.parametrize("runtime", ["unset", "open to others", "relative"])
def test_without_a_memory_dir_or_a_private_xdg_runtime_dir_the_memory_tier_is_in_dev_shm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str) -> None:
    if runtime == "unset":
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    elif runtime == "open to others":
        private_runtime_dir(tmp_path, monkeypatch, mode=0o755)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", "run-user")
    env = dry_run_environment(tmp_path, "--memory-tier")
    assert Path(env[ENV_MEMORY_TIER]).parent == Path(f"/dev/shm/cycler-{os.geteuid()}")
    assert Path(env[ENV_NODE_DIR]).parent == Path(f"/dev/shm/cycler-{os.geteuid()}-run")


@pytest.mark.parametrize("every", [0, -3, True])
def test_persist_every_must_be_a_positive_whole_number(every: object) -> None:
    with pytest.raises(ConfigError, match="persist-every must be a whole number"):
        resolve_run_options(script="train.py", environ={}, flags={"persist_every": every})


@pytest.mark.parametrize(("flags", "fix"), [
    ({"preemption_notices": "oracle"}, "preemption-notices must be one of auto, off, aws"),
    ({"metadata_endpoint": "169.254.169.254"}, "metadata-endpoint must be an http"),
])
def test_bad_preemption_notice_options_are_one_line(flags: dict[str, str], fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        resolve_run_options(script="train.py", environ={}, flags=flags)


def test_the_agent_imports_dynamo_only_for_a_script_that_names_what_imports_it(tmp_path: Path):
    ddp, plain = tmp_path / "ddp.py", tmp_path / "plain.py"
    ddp.write_text("from torch.nn.parallel import DistributedDataParallel\n")
    plain.write_text("import torch\nprint(torch.ones(1))\n")
    assert fork_preloads(ddp) == "torch._dynamo"
    assert fork_preloads(plain) == "1"
    assert fork_preloads(tmp_path / "missing.py") == "1"
    command = torchrun_command(RunOptions(script=ddp), python="py")
    assert command[3] == "--cycle-fork=torch._dynamo"
