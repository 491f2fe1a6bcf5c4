"""The shell's pure parts: the signal handler, the multi-node stop check, the pre-start checks."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cycler.errors import CheckpointDirectoryError, ConfigError
from cycler.protocol.control import (
    Action,
    ControlRequest,
    earliest_deadline,
    stops_since,
    write_control,
)
from cycler.protocol.record import RunRecord
from cycler.supervisor.checks import check_script, prepare_checkpoint_root
from cycler.supervisor.configuration.options import RunOptions
from cycler.supervisor.decisions.core import SignalReceived
from cycler.supervisor.shell import Supervisor, stop_requested_elsewhere, stops_of_other_nodes


def request(action: Action, at: float) -> ControlRequest:
    return ControlRequest(sequence=1, action=action, reason="SIGTERM", requested_at=at)


def test_the_signal_handler_only_records_the_signal_with_the_time(tmp_path: Path):
    options = RunOptions(script=tmp_path / "t.py", checkpoint_dir=tmp_path / "ck")
    supervisor = Supervisor(options, clock=lambda: 12.5)
    supervisor.handle_signal(signal.SIGTERM, None)
    supervisor.handle_signal(signal.SIGCONT, None)
    assert supervisor._queue.get_nowait() == SignalReceived("SIGTERM", 12.5)
    assert supervisor._queue.get_nowait() == SignalReceived("SIGCONT", 12.5)
    assert not (tmp_path / "ck").exists(), "handling a signal touches no file"


def test_a_stop_asked_on_another_node_since_the_start_is_seen(tmp_path: Path):
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir()
    write_control(run_record.control_path(1), request(Action.CHECKPOINT_AND_EXIT, at=100.0))
    assert stop_requested_elsewhere(run_record, node_rank=0, since=99.0)
    assert not stop_requested_elsewhere(run_record, node_rank=0, since=101.0), "an old request"
    assert not stop_requested_elsewhere(run_record, node_rank=1, since=99.0), "its own file"


def test_the_earliest_deadline_of_the_stops_asked_since_the_start_is_found(tmp_path: Path):
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir()
    for node, at, deadline in [(1, 100.0, 160.0), (2, 101.0, 130.0), (3, 50.0, 60.0)]:
        write_control(run_record.control_path(node), ControlRequest(
            sequence=1, action=Action.CHECKPOINT_AND_EXIT, reason="SIGTERM", requested_at=at,
            deadline=deadline))
    write_control(run_record.control_path(4), request(Action.RUN, at=102.0))
    found = stops_since(run_record.control_paths(), since=99.0)
    assert earliest_deadline(found) == 130.0, "3's is old"
    assert earliest_deadline(stops_since(run_record.control_paths(), since=200.0)) is None


def test_a_run_request_on_another_node_is_not_a_stop(tmp_path: Path):
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir()
    write_control(run_record.control_path(1), request(Action.RUN, at=100.0))
    assert not stop_requested_elsewhere(run_record, node_rank=0, since=0.0)


def test_a_missing_script_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        check_script(RunOptions(script=tmp_path / "missing.py"))


def test_the_checkpoint_root_is_created_and_probed(tmp_path: Path):
    options = RunOptions(script=Path("t.py"), checkpoint_dir=tmp_path / "a" / "b")
    prepare_checkpoint_root(options)
    assert (tmp_path / "a" / "b" / ".cycler").is_dir()
    assert list((tmp_path / "a" / "b" / ".cycler").iterdir()) == [], "the probe is removed"


def test_a_checkpoint_root_below_a_file_is_refused(tmp_path: Path):
    (tmp_path / "file").write_text("")
    options = RunOptions(script=Path("t.py"), checkpoint_dir=tmp_path / "file" / "ck")
    with pytest.raises(CheckpointDirectoryError, match="choose a writable --checkpoint-dir"):
        prepare_checkpoint_root(options)


def test_a_read_only_root_is_refused_even_when_its_cycler_directory_is_writable(
        tmp_path: Path):
    import subprocess

    root = tmp_path / "ck"
    (root / ".cycler").mkdir(parents=True)
    # As root, permissions do not stop a write; an immutable directory does (ext4, xfs).
    if subprocess.run(["chattr", "+i", str(root)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here to make a directory read-only for root")
    try:
        options = RunOptions(script=Path("t.py"), checkpoint_dir=root)
        with pytest.raises(CheckpointDirectoryError, match="cannot write to the checkpoint"):
            prepare_checkpoint_root(options)
    finally:
        subprocess.run(["chattr", "-i", str(root)], check=True)


def test_the_watchdog_kills_what_it_registered_but_never_a_pid_that_became_another_process():
    import subprocess
    import sys
    import time

    from cycler.supervisor.launch.processes import Watchdog

    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                for _ in range(2)]
    registered, reused = sleepers
    watchdog = Watchdog()
    try:
        watchdog.watch(registered.pid)
        # As if `reused` had been registered with another start time: its pid now belongs to a
        # process the job never had.
        watchdog._send(f"+{reused.pid} 1\n")
    finally:
        watchdog.close()  # what the supervisor's death does: end of input for the watchdog
    assert registered.wait(timeout=10) == -9
    time.sleep(0.2)
    assert reused.poll() is None, "a process the watchdog could not verify was killed"
    reused.kill()
    reused.wait()


def test_resume_from_is_dropped_for_a_requeued_run_and_after_this_job_carried_it_out(
        tmp_path: Path):
    from dataclasses import replace

    from cycler.protocol.record import RunRecord
    from cycler.supervisor.checks import record_resume_from, resume_from_for_this_run

    options = RunOptions(script=Path("t.py"), checkpoint_dir=tmp_path, resume_from="3")
    assert resume_from_for_this_run(options).resume_from == "3", "the job's first run rolls back"
    assert resume_from_for_this_run(replace(options, requeue_count=1)).resume_from is None
    record_resume_from(RunRecord(tmp_path), 0, "3")
    assert resume_from_for_this_run(options).resume_from is None, "a rerun of the same command"
    assert resume_from_for_this_run(replace(options, resume_from="1")).resume_from == "1", (
        "another --resume-from is a new rollback")


def test_a_rerun_whose_resume_from_checkpoint_was_rotated_away_is_no_error(tmp_path: Path):
    from cycler.protocol.record import RunRecord
    from cycler.supervisor.checks import record_resume_from
    from cycler.supervisor.shell import plan_run

    script = tmp_path / "t.py"
    script.write_text("")
    options = RunOptions(script=script, checkpoint_dir=tmp_path / "ck", resume_from="0")
    with pytest.raises(ConfigError, match="--resume-from"):
        plan_run(options)
    record_resume_from(RunRecord(tmp_path / "ck"), 0, "0")
    assert "CYCLER_RESUME_FROM" not in plan_run(options).environment


def test_another_nodes_stop_is_the_checkpoint_and_exit_another_node_asked_since_the_start():
    def entry(node: int, at: float, action: Action = Action.CHECKPOINT_AND_EXIT) -> dict:
        request = ControlRequest(sequence=1, action=action, reason="SIGTERM", requested_at=at,
                                 deadline=at + 60)
        return {"node": node, "request": request.to_json()}

    entries = [entry(1, 100.0), entry(0, 200.0), entry(2, 50.0), entry(3, 200.0, Action.RUN),
               {"node": 2, "request": "not json"}, {"request": entry(2, 300.0)["request"]}]
    found = stops_of_other_nodes(entries, node_rank=1, since=150.0)
    assert [request.requested_at for request in found] == [200.0, 300.0], \
        "not its own, not one before this start, not a run request, not a garbled one"
