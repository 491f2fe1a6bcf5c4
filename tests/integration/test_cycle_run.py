"""``cycle run`` with real torchrun workers, real signals and real kills.

The workers are a small script written into the test's directory: they announce themselves with
files, poll the control file every 0.05 s step, and on ``checkpoint_and_exit`` rank 0 commits a
checkpoint with AtomicDirectory and every rank exits 0. ``--mode`` makes them crash, ignore the
request, or spawn a grandchild. Process checks use psutil on the real process tree.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from cycle_jobs import Job as _Job
from cycle_jobs import assert_all_gone, fake_scontrol, wait_for
from typer.testing import CliRunner

from cycler.checkpoint.listing import latest_checkpoint
from cycler.checkpoint.lock import SupervisorLock
from cycler.protocol.control import Action, read_control
from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE, EXIT_SUCCESS, EXIT_USAGE
from cycler.protocol.record import RunRecord
from cycler_cli.main import app

WORKER = r'''
import argparse, os, signal, subprocess, sys, time
from pathlib import Path

from cycler.protocol.control import Action, ControlFileWatcher

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="stop")
parser.add_argument("--dir", required=True)
parser.add_argument("--steps", type=int, default=100000)
args = parser.parse_args()
rank = int(os.environ["RANK"])
start = int(os.environ["CYCLER_RESTART_COUNT"])
out = Path(args.dir)
(out / f"pid-{rank}-{start}").write_text(str(os.getpid()))
if args.mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.mode == "grandchild":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (out / f"grandchild-{rank}").write_text(str(child.pid))
last_rank = int(os.environ["WORLD_SIZE"]) - 1
if args.mode == "always-crash" or (args.mode == "crash-once" and start == 0 and rank == last_rank):
    raise RuntimeError(f"deliberate failure on rank {rank}")
watcher = ControlFileWatcher(os.environ["CYCLER_CONTROL_FILE"])
(out / f"ready-{rank}-{start}").write_text("")
for step in range(args.steps):
    request = watcher.poll()
    if request is not None and request.action is Action.CHECKPOINT_AND_EXIT:
        if args.mode != "ignore":
            if rank == 0:
                # torch only when saving
                from cycler.checkpoint.atomic_directory import AtomicDirectory

                saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"], strategy="offline")
                path = saver.prepare_checkpoint_directory()
                Path(path, "state.txt").write_text(str(step))
                saver.symlink_latest(path, {"step": step})
            (out / f"stopped-{rank}").write_text(str(step))
            sys.exit(0)
    time.sleep(0.05)
(out / f"finished-{rank}").write_text("")
'''


class Job(_Job):
    """A job running :data:`WORKER`."""

    def __init__(self, tmp_path: Path, *flags: str, **kwargs: object) -> None:
        super().__init__(tmp_path, *flags, worker=WORKER, **kwargs)  # type: ignore[arg-type]


# --- stopping on request ----------------------------------------------------------------------


@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_checkpoints_and_exits_75_with_the_stop_recorded(tmp_path: Path, jobs: list[Job],
                                                                   nproc: int):
    job = Job(tmp_path, "--grace", "30", nproc=nproc)
    jobs.append(job)
    job.wait_ready(nproc)
    tree = job.tree()
    job.send(signal.SIGTERM)
    assert job.wait() == EXIT_REQUEUE, job.output()
    checkpoint = latest_checkpoint(job.root)
    assert checkpoint is not None and (checkpoint / "state.txt").exists()
    assert all((tmp_path / f"stopped-{rank}").exists() for rank in range(nproc))
    request = read_control(job.layout.record.control_path(0))
    assert request is not None and request.action is Action.CHECKPOINT_AND_EXIT
    assert request.reason == "SIGTERM" and request.deadline is not None
    names = job.event_names()
    for expected in ("start", "workers_started", "signal", "stop_requested",
                     "checkpoint_committed", "workers_exited", "exit"):
        assert expected in names
    assert names.index("checkpoint_committed") < names.index("exit")
    assert job.events()[-1]["code"] == EXIT_REQUEUE
    assert_all_gone(tree, within=2.0)


def test_sigcont_is_logged_and_the_job_runs_on_to_finish(tmp_path: Path, jobs: list[Job]):
    job = Job(tmp_path, mode="finish", steps=40)
    jobs.append(job)
    job.wait_ready()
    job.send(signal.SIGCONT)
    assert job.wait() == EXIT_SUCCESS, job.output()
    assert (tmp_path / "finished-0").exists()
    signals = [e for e in job.events() if e["event"] == "signal"]
    assert signals == [{**signals[0], "signal": "SIGCONT", "effect": "ignored"}]
    request = read_control(job.layout.record.control_path(0))
    assert request is not None and request.action is Action.RUN
    events = job.layout.record.events_path(0)
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert [r["event"] for r in records].count("exit") == 1, "the log is JSON lines"
    assert records[-2] == {**records[-2], "event": "exit", "code": EXIT_SUCCESS}
    assert records[-1] == {**records[-1], "event": "ended", "code": EXIT_SUCCESS}


def test_sigusr1_not_among_the_signals_is_said_and_ignored_and_a_sigterm_still_stops(
        tmp_path: Path, jobs: list[Job]):
    # Lightning's Slurm recipe sends USR1: its default ended cycle run at once (exit 138),
    # silently, with the work since the last checkpoint lost.
    job = Job(tmp_path, "--grace", "30")
    jobs.append(job)
    job.wait_ready()
    job.send(signal.SIGUSR1)
    job.send(signal.SIGUSR1)
    wait_for(lambda: "SIGUSR1 ignored" in job.output(), "the line saying so", job, timeout=10)
    assert job.process.poll() is None, job.output()
    job.send(signal.SIGTERM)
    # USR1s through the stop and the end: one after the run's verdict, as the lock was released
    # and the process left, ended it with 138 where the log said 75 (Slurm would not requeue).
    while job.process.poll() is None:
        job.send(signal.SIGUSR1)
        time.sleep(0.02)
    assert job.wait() == EXIT_REQUEUE, job.output()
    assert job.output().count("SIGUSR1 ignored: it is not one of --signals") == 1
    assert latest_checkpoint(job.root) is not None


PLAIN_SLOW_STOP = r'''
import argparse, os, signal, sys, time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--mode")
parser.add_argument("--dir")
args = parser.parse_args()
rank = int(os.environ["RANK"])
out = Path(args.dir)
if rank == 0:
    def stop(*_):
        time.sleep(3)
        (out / "written-0").write_text("saved")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
(out / f"ready-{rank}-0").write_text("")
time.sleep(120)
'''


def test_a_stop_leaves_a_plain_script_s_rank_its_time_when_another_rank_dies_of_the_signal(
        tmp_path: Path, jobs: list[_Job]):
    # A script that imports nothing of cycler: rank 1 dies of the stop's SIGTERM, which torch
    # sees as a failure; rank 0's handler writes for 3 s. The survivors of a failure get 2 s,
    # but a stop is not a failure: torch's time and the grace hold, as under torchrun.
    job = _Job(tmp_path, "--grace", "30", nproc=2, worker=PLAIN_SLOW_STOP)
    jobs.append(job)
    job.wait_ready(2)
    job.send(signal.SIGTERM)
    job.wait()
    assert (tmp_path / "written-0").read_text() == "saved", job.output()


# --- failures ---------------------------------------------------------------------------------


def test_a_worker_that_crashes_once_is_restarted_and_the_run_completes(tmp_path: Path,
                                                                        jobs: list[Job]):
    job = Job(tmp_path, "--restart-delay", "0.1", mode="crash-once", steps=10, nproc=2)
    jobs.append(job)
    assert job.wait(timeout=120) == EXIT_SUCCESS, job.output()
    assert (tmp_path / "finished-0").exists() and (tmp_path / "finished-1").exists()
    assert (tmp_path / "pid-0-1").exists(), "the restart sees CYCLER_RESTART_COUNT=1"
    names = job.event_names()
    assert names.count("workers_started") == 2 and "restart_scheduled" in names


def test_a_worker_that_always_crashes_ends_with_exit_1_and_its_error(tmp_path: Path,
                                                                     jobs: list[Job]):
    job = Job(tmp_path, "--restart-delay", "0.1", "--max-restarts", "1", mode="always-crash")
    jobs.append(job)
    assert job.wait(timeout=120) == EXIT_FAILURE
    output = job.output()
    report = output[output.rindex("cycle: error:"):]
    assert "restarts (--max-restarts) since the last checkpoint are used up" in report
    assert "rank 0 (local_rank: 0) failed with exit code 1" in report
    assert "RuntimeError: deliberate failure on rank 0" in report
    assert "ChildFailedError" not in report
    assert job.event_names().count("workers_started") == 2


# --- nothing survives -------------------------------------------------------------------------


def test_kill_9_of_the_supervisor_leaves_no_worker_or_grandchild(tmp_path: Path,
                                                                 jobs: list[Job]):
    job = Job(tmp_path, mode="grandchild", nproc=2)
    jobs.append(job)
    job.wait_ready(2)
    wait_for(lambda: (tmp_path / "grandchild-1").exists(), "grandchildren")
    tree = job.tree()
    grandchildren = [int((tmp_path / f"grandchild-{r}").read_text()) for r in range(2)]
    assert set(grandchildren) <= {p.pid for p in tree}
    assert len(tree) >= 6, "torchrun, 2 workers, 2 grandchildren and the watchdog"
    job.send(signal.SIGKILL)
    job.wait()
    assert_all_gone(tree, within=5.0)


def test_a_second_sigint_stops_at_once(tmp_path: Path, jobs: list[Job]):
    job = Job(tmp_path, "--grace", "60", mode="ignore", nproc=2)
    jobs.append(job)
    job.wait_ready(2)
    tree = job.tree()
    job.send(signal.SIGINT)
    wait_for(lambda: "stop_requested" in job.event_names(), "the stop request", job)
    started = time.monotonic()
    job.send(signal.SIGINT)
    code = job.wait(timeout=30)
    assert time.monotonic() - started < 15, "long before the 60 s grace"
    assert code == EXIT_FAILURE, "no checkpoint exists to resume from"
    effects = [e.get("effect") for e in job.events() if e["event"] == "signal"]
    assert effects == ["checkpoint_and_exit", "stop now"]
    assert_all_gone(tree, within=2.0)


def test_workers_that_ignore_the_request_are_killed_after_the_grace(tmp_path: Path,
                                                                    jobs: list[Job]):
    job = Job(tmp_path, "--grace", "1", mode="ignore")
    jobs.append(job)
    job.wait_ready()
    tree = job.tree()
    started = time.monotonic()
    job.send(signal.SIGTERM)
    job.wait(timeout=30)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 12, elapsed
    names = job.event_names()
    assert names.index("grace_expired") < names.index("workers_exited")
    sent = [e["signal"] for e in job.events() if e["event"] == "signal_sent"]
    assert sent == ["SIGTERM", "SIGKILL"], "the worker ignores SIGTERM, so SIGKILL follows"
    assert_all_gone(tree, within=2.0)


# --- requeue ----------------------------------------------------------------------------------


def test_cont_and_term_twice_under_slurm_requeue_the_job_once(tmp_path: Path, jobs: list[Job]):
    path_env, record = fake_scontrol(tmp_path)
    job = Job(tmp_path, env={**path_env, "SLURM_JOB_ID": "9876", "SLURM_RESTART_COUNT": "1"})
    jobs.append(job)
    job.wait_ready(start=1)
    for _ in range(2):
        job.send(signal.SIGCONT)
        job.send(signal.SIGTERM)
        time.sleep(0.1)
    assert job.wait() == EXIT_REQUEUE, job.output()
    assert record.read_text().splitlines() == ["requeue 9876"]
    requeue = [e for e in job.events() if e["event"] == "requeue"]
    assert len(requeue) == 1 and requeue[0]["accepted"] is True


def test_requeues_stop_at_max_requeues_counted_by_slurm_restart_count(tmp_path: Path,
                                                                      jobs: list[Job]):
    path_env, record = fake_scontrol(tmp_path)
    job = Job(tmp_path, "--max-requeues", "3",
              env={**path_env, "SLURM_JOB_ID": "9876", "SLURM_RESTART_COUNT": "3"})
    jobs.append(job)
    job.wait_ready(start=3)
    job.send(signal.SIGTERM)
    assert job.wait() == EXIT_REQUEUE, job.output()
    assert not record.exists(), "scontrol was not called"
    assert "requeue_skipped" in job.event_names()


def test_a_stop_while_slurm_is_already_ending_the_job_does_not_requeue_it(tmp_path: Path,
                                                                         jobs: list[Job]):
    # scancel, preemption and outside requeues find the job COMPLETING; requeueing then would
    # turn every scancel into another requeue.
    path_env, record = fake_scontrol(tmp_path, job_state="COMPLETING")
    job = Job(tmp_path, env={**path_env, "SLURM_JOB_ID": "9876"})
    jobs.append(job)
    job.wait_ready(start=0)
    job.send(signal.SIGCONT)
    job.send(signal.SIGTERM)
    assert job.wait() == EXIT_REQUEUE, job.output()
    assert not record.exists(), "scontrol requeue must not run"
    requeue = [e for e in job.events() if e["event"] == "requeue"]
    assert len(requeue) == 1 and requeue[0]["accepted"] is False
    assert "COMPLETING" in requeue[0]["detail"]


# --- usage errors, dry run and config (in-process, nothing started) ----------------------------

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None):  # noqa: ANN201
    return runner.invoke(app, ["run", *args], env=env)


def test_a_stop_slurm_is_already_ending_is_cut_to_killwait_not_the_grace(tmp_path: Path,
                                                                        jobs: list[Job]):
    # scancel or a preemption: Slurm SIGKILLs the job KillWait (here 8 s) after its TERM, so
    # the 60 s grace must not be waited for; the workers here ignore the request.
    path_env, _ = fake_scontrol(tmp_path, job_state="COMPLETING", kill_wait=8)
    job = Job(tmp_path, "--grace", "60", mode="ignore", env={**path_env, "SLURM_JOB_ID": "55"})
    jobs.append(job)
    job.wait_ready()
    sent = time.monotonic()
    job.send(signal.SIGTERM)
    job.wait(timeout=30)
    assert time.monotonic() - sent < 8.0, "the stop outlived Slurm's KillWait"
    (deadline,) = [e for e in job.events() if e["event"] == "deadline"]
    assert deadline["seconds_left"] <= 3.0 and "KillWait 8 s" in deadline["why"]
    assert "grace_expired" in job.event_names()


def test_dry_run_prints_the_torchrun_command_and_the_added_environment(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("")
    result = invoke("--dry-run", "--nproc-per-node", "2", "--checkpoint-dir", str(tmp_path / "c"),
                    str(script), "--grace", "3", "--lr=0.1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"CYCLER_CHECKPOINT_DIR={tmp_path / 'c'}" in lines
    # The control request the ranks poll is on the node, in the job's own directory there.
    environment = dict(line.split("=", 1) for line in lines if line.startswith("CYCLER_"))
    node_dir = Path(environment["CYCLER_NODE_DIR"])
    assert environment["CYCLER_CONTROL_FILE"] == str(node_dir / "control-node0.json")
    assert tmp_path not in node_dir.parents
    assert "CYCLER_RESTART_COUNT=0" in lines
    command = lines[-1]
    assert (" -m cycler.supervisor.launch.launcher --cycle-fork=1 --nproc-per-node 2 --nnodes 1 "
            "--max-restarts 0 --monitor-interval 0.02 ") in command
    assert command.endswith(f"{script} --grace 3 --lr=0.1")
    assert not (tmp_path / "c").exists(), "a dry run creates nothing"


def test_dry_run_under_slurm_uses_the_first_host_and_the_node_id(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("")
    env = {"SLURM_JOB_ID": "55", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_RESTART_COUNT": "2"}
    result = invoke("--dry-run", "--checkpoint-dir", str(tmp_path), str(script), env=env)
    assert result.exit_code == 0, result.output
    assert "--cycle-node-rank=1 " in result.stdout, "node 1 keeps group rank 1"
    assert ("--nnodes 2 --max-restarts 1000000 --monitor-interval 0.02 --rdzv-backend c10d "
            "--rdzv-endpoint node07:20055 --rdzv-id 55 --rdzv-conf is_host=0,join_timeout=630 "
            ) in result.stdout
    assert "CYCLER_RESTART_COUNT=2" in result.stdout
    assert "CYCLER_CONTROL_FILE=" in result.stdout and "control-node1.json" in result.stdout


def assert_usage_error(result, fragment: str) -> None:  # noqa: ANN001
    assert result.exit_code == EXIT_USAGE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cycle: error:"), result.stderr
    assert fragment in lines[0]


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--grace", "0"], "grace must be a finite number of seconds above 0"),
    (["--grace", "inf"], "grace must be a finite number of seconds above 0"),
    (["--nproc-per-node", "0"], "nproc-per-node must be a number of at least 1"),
    (["--max-restarts", "-1"], "max-restarts must be 0 or more"),
    (["--signals", "KILL"], "not a signal the supervisor can use"),
    (["--resume-from", "AtomicDirectory_checkpoint_4"], "--resume-from: "),
])
def test_bad_flag_values_exit_2_with_one_line_and_start_nothing(tmp_path: Path,
                                                                 flags: list[str], fragment: str):
    script = tmp_path / "train.py"
    script.write_text("")
    root = tmp_path / "ck"
    assert_usage_error(invoke(*flags, "--checkpoint-dir", str(root), str(script)), fragment)
    assert not (root / ".cycler").exists() or not list((root / ".cycler").glob("events-*"))


def test_a_missing_script_exits_2_before_anything_is_created(tmp_path: Path):
    root = tmp_path / "ck"
    result = invoke("--checkpoint-dir", str(root), str(tmp_path / "nope.py"))
    assert_usage_error(result, "does not exist")
    assert not root.exists()


def test_an_unwritable_checkpoint_directory_exits_2(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("")
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke("--checkpoint-dir", str(blocker / "ck"), str(script))
    assert_usage_error(result, "cannot create the checkpoint root")


def test_a_second_cycle_run_on_the_same_root_and_node_exits_2(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("")
    root = tmp_path / "ck"
    lock = SupervisorLock(RunRecord(root).lock_path(0))
    lock.acquire()
    try:
        assert_usage_error(invoke("--checkpoint-dir", str(root), str(script)), "in use")
    finally:
        lock.release()
    assert not RunRecord(root).events_path(0).exists(), "nothing was started"


def test_a_config_file_sets_options_and_flags_win(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("")
    config = tmp_path / "cycle.yaml"
    config.write_text(f"nproc-per-node: 3\ngrace: 7\ncheckpoint_dir: {tmp_path / 'fromfile'}\n")
    result = invoke("--config", str(config), "--nproc-per-node", "2", "--dry-run", str(script))
    assert result.exit_code == 0, result.output
    assert "--nproc-per-node 2 " in result.stdout
    assert f"CYCLER_CHECKPOINT_DIR={tmp_path / 'fromfile'}" in result.stdout
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=17" in result.stdout, "grace 7 s + 10 s margin"


def test_config_file_errors_exit_2_naming_the_key_and_the_file(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("")
    config = tmp_path / "cycle.yaml"
    config.write_text("max_restarts: lots\n")
    result = invoke("--config", str(config), "--dry-run", str(script))
    assert_usage_error(result, f"config file {config}: max_restarts must be int")
    config.write_text("restarts: 3\n")
    assert_usage_error(invoke("--config", str(config), str(script)), "unknown key 'restarts'")



def test_resume_from_an_existing_checkpoint_is_exported_to_the_workers(tmp_path: Path):
    from cycler.checkpoint.atomic_directory import AtomicDirectory

    script = tmp_path / "train.py"
    script.write_text("")
    saver = AtomicDirectory(tmp_path / "ck", strategy="offline")
    for _ in range(2):
        saver.symlink_latest(saver.prepare_checkpoint_directory())
    result = invoke("--resume-from", "AtomicDirectory_checkpoint_0", "--checkpoint-dir",
                    str(tmp_path / "ck"), "--dry-run", str(script))
    assert result.exit_code == 0, result.output
    assert "CYCLER_RESUME_FROM=AtomicDirectory_checkpoint_0" in result.stdout.splitlines()
