"""`cycle status` and `cycle prune` through typer's runner, on real directories."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cycler import AtomicDirectory
from cycler.checkpoint.layout import CheckpointLayout
from cycler.checkpoint.lock import SupervisorLock
from cycler.protocol.record import RunRecord
from cycler_cli.main import app

runner = CliRunner()


def make_checkpoints(root: Path, count: int, pinned: tuple[int, ...] = ()) -> AtomicDirectory:
    saver = AtomicDirectory(root)
    for index in range(count):
        directory = Path(saver.prepare_checkpoint_directory(force_save=index in pinned))
        (directory / "model.pt").write_bytes(os.urandom(1000 + index))
        saver.symlink_latest(directory, metadata={"step": index * 10, "epoch": index // 2})
    return saver


def status_json(root: Path, *extra: str) -> dict:
    result = runner.invoke(app, ["status", str(root), "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_status_lists_every_checkpoint_with_step_epoch_and_state(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 3, pinned=(0,))
    (tmp_path / "AtomicDirectory_checkpoint_3").mkdir()
    rows = status_json(tmp_path)["checkpoints"]
    assert [(r["index"], r["step"], r["epoch"], r["state"]) for r in rows] == [
        (0, 0, 0, "pinned"), (1, 10, 0, "valid"), (2, 20, 1, "latest"), (3, None, None,
                                                                          "incomplete"),
    ]
    assert rows[2]["size"] == 1002


def status_text(root: Path, columns: int = 80) -> str:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "cycler_cli", "status", str(root)],
                          env={**os.environ, "COLUMNS": str(columns)}, capture_output=True,
                          text=True, check=True).stdout


def test_status_fits_80_columns_with_whole_states_and_the_jobs_history(tmp_path: Path) -> None:
    from cycler.protocol.events import EventLog

    root = tmp_path / "a-rather-long-directory-name-for-the-checkpoints-of-this-job"
    make_checkpoints(root, 3, pinned=(0,))
    log = EventLog(RunRecord(root).events_path(0))
    log.append("start", script="train.py", nproc_per_node=2, node_rank=0, nnodes=1)
    for index in range(3):
        log.append("checkpoint_committed", index=index)
    log.append("stop_requested", path="agreed_step", grace=60.0, resume_from=2)
    log.append("requeue", job_id="77", accepted=True, detail="requeued")
    log.append("restart_scheduled", restart=1, of=3, delay=1.0, code=1)
    text = status_text(root)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80, text
    header = next(line.split() for line in lines if "index" in line.split())
    assert header == ["index", "step", "epoch", "size", "age", "state"]
    assert all(word in text.split() for word in ("pinned", "valid", "latest"))
    text = " ".join(text.split())  # table cells wrap: read the words in order
    assert "AtomicDirectory checkpoints in" in text
    assert "checkpoints 0 to 2 committed" in text
    assert "checkpoint at a step they agree on" in text
    assert "scontrol requeue 77: requeued" in text and "restarting in 1 s" in text
    assert "History (starts 1, stops 1, restarts 1, requeues 1)" in text
    assert "Supervisor: none running" in text


def test_status_verify_reports_a_flipped_byte_as_corrupt(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 2)
    model = tmp_path / "AtomicDirectory_checkpoint_1" / "model.pt"
    data = bytearray(model.read_bytes())
    data[10] ^= 0xFF
    model.write_bytes(bytes(data))
    assert status_json(tmp_path)["checkpoints"][1]["state"] == "latest"
    rows = status_json(tmp_path, "--verify")["checkpoints"]
    assert rows[1]["state"] == "corrupt" and "checksum" in rows[1]["problem"]
    assert rows[0]["state"] == "latest"


def test_status_of_a_missing_directory_is_one_line_and_exit_one(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert result.output.strip() == f"No checkpoint directory at {tmp_path / 'nowhere'}."


def test_status_of_a_gone_root_names_the_memory_tier_its_job_left_in_the_given_memory_dir(
        tmp_path: Path) -> None:
    from cycler._private import make_parents_private
    from cycler.checkpoint.memory_roots import memory_base, memory_root

    gone = tmp_path / "checkpoints"
    tier = memory_root(memory_base(tmp_path / "ram"), gone)
    make_parents_private(tier)
    result = runner.invoke(app, ["status", str(gone), "--memory-dir", str(tmp_path / "ram")])
    assert result.exit_code == 1
    said = "".join(result.output.split())  # the console wraps the long path
    assert "".join(f"a memory tier of an earlier job of this root is still at {tier}".split()) \
        in said
    # Without the flag only the default base is looked in: nothing of this one is named.
    assert "memorytier" not in "".join(runner.invoke(app, ["status", str(gone)]).output.split())


def test_status_of_an_empty_directory_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 0
    assert f"No checkpoints in {tmp_path}." in result.output


def test_status_of_a_file_is_a_one_line_error_with_exit_two(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    result = runner.invoke(app, ["status", str(target)])
    assert result.exit_code == 2
    assert "is not a directory" in result.output and "Traceback" not in result.output


def test_status_directory_defaults_to_the_environment(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 1)
    result = runner.invoke(app, ["status", "--json"], env={"CYCLER_CHECKPOINT_DIR": str(tmp_path)})
    assert json.loads(result.stdout)["root"] == str(tmp_path)


def test_status_shows_a_live_supervisor_and_recent_events(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 1)
    layout = CheckpointLayout(tmp_path)
    from cycler.protocol.events import EventLog

    EventLog(layout.record.events_path(0)).append("signal", signal="SIGTERM")
    with SupervisorLock(layout.record.lock_path(0)):
        report = status_json(tmp_path)
    assert report["supervisors"][0]["pid"] == os.getpid()
    assert report["events"][-1]["signal"] == "SIGTERM"
    assert status_json(tmp_path)["supervisors"] == []


def test_prune_dry_run_prints_decisions_and_deletes_nothing(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 4)
    before = sorted(os.listdir(tmp_path))
    result = runner.invoke(app, ["prune", str(tmp_path), "--keep-last", "2", "--dry-run", "--json"])
    assert result.exit_code == 0
    decisions = {d["name"]: d["keep"] for d in json.loads(result.stdout)["decisions"]}
    assert decisions == {"AtomicDirectory_checkpoint_0": False,
                         "AtomicDirectory_checkpoint_1": False,
                         "AtomicDirectory_checkpoint_2": True,
                         "AtomicDirectory_checkpoint_3": True}
    assert sorted(os.listdir(tmp_path)) == before


def test_prune_keeps_latest_and_pinned_and_removes_torn_and_old(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 4, pinned=(1,))
    (tmp_path / "AtomicDirectory_checkpoint_4").mkdir()
    result = runner.invoke(app, ["prune", str(tmp_path), "--keep-last", "1"])
    assert result.exit_code == 0, result.output
    names = sorted(n for n in os.listdir(tmp_path) if "checkpoint_" in n)
    assert names == ["AtomicDirectory_checkpoint_1_force", "AtomicDirectory_checkpoint_3"]


def test_prune_never_follows_a_symlink_or_leaves_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    make_checkpoints(root, 2)
    make_checkpoints(outside, 1)
    (root / "AtomicDirectory_checkpoint_0").rename(tmp_path / "moved")
    os.symlink(outside / "AtomicDirectory_checkpoint_0", root / "AtomicDirectory_checkpoint_0")
    result = runner.invoke(app, ["prune", str(root), "--keep-last", "1"])
    assert result.exit_code == 0, result.output
    assert (root / "AtomicDirectory_checkpoint_0").is_symlink()
    assert (outside / "AtomicDirectory_checkpoint_0" / "model.pt").exists()
    assert (root / "AtomicDirectory_checkpoint_1" / "model.pt").exists()


def test_prune_keeps_the_newest_valid_checkpoint_when_the_link_is_broken(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 3)
    os.unlink(tmp_path / "AtomicDirectory.latest_checkpoint")
    link = tmp_path / "AtomicDirectory.latest_checkpoint"
    os.symlink(tmp_path / "AtomicDirectory_checkpoint_9", link)
    result = runner.invoke(app, ["prune", str(tmp_path), "--keep-last", "1"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "AtomicDirectory_checkpoint_2" / "cycler_manifest.json").exists()


def test_prune_refuses_a_root_held_by_a_live_supervisor_unless_forced(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 3)
    with SupervisorLock(RunRecord(tmp_path).lock_path(0)):
        refused = runner.invoke(app, ["prune", str(tmp_path), "--keep-last", "1"])
        assert refused.exit_code == 2
        assert "live cycle run" in refused.output and "--force" in refused.output
        assert (tmp_path / "AtomicDirectory_checkpoint_0").exists()
        forced = runner.invoke(app, ["prune", str(tmp_path), "--keep-last", "1", "--force"])
        assert forced.exit_code == 0
    assert not (tmp_path / "AtomicDirectory_checkpoint_0").exists()


def test_prune_spares_a_torn_directory_that_a_live_writer_may_be_filling(tmp_path: Path) -> None:
    saver = make_checkpoints(tmp_path, 2)
    in_progress = Path(saver.prepare_checkpoint_directory())
    result = runner.invoke(app, ["prune", str(tmp_path)])
    assert result.exit_code == 0
    assert in_progress.exists()
    saver.symlink_latest(in_progress)
    assert (in_progress / "cycler_manifest.json").exists()


def test_prune_removes_stale_temporaries(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 1)
    stale = tmp_path / ".AtomicDirectory.latest_checkpoint.cycler-tmp-0123456789ab"
    os.symlink(tmp_path / "AtomicDirectory_checkpoint_0", stale)
    result = runner.invoke(app, ["prune", str(tmp_path)])
    assert result.exit_code == 0
    assert not os.path.lexists(stale)
    assert (tmp_path / "AtomicDirectory_checkpoint_0").exists()


@pytest.mark.parametrize("command", ["status", "prune"])
def test_commands_handle_several_savers_in_one_root(tmp_path: Path, command: str) -> None:
    make_checkpoints(tmp_path, 2)
    other = AtomicDirectory(tmp_path, name="ema")
    directory = other.prepare_checkpoint_directory()
    other.symlink_latest(directory)
    result = runner.invoke(app, [command, str(tmp_path), "--json"])
    assert result.exit_code == 0
    assert "ema_checkpoint_0" in result.stdout


def test_prune_remembers_removed_indices_so_they_are_never_reused(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 2)
    (tmp_path / "AtomicDirectory_checkpoint_7").mkdir()
    assert runner.invoke(app, ["prune", str(tmp_path)]).exit_code == 0
    assert not (tmp_path / "AtomicDirectory_checkpoint_7").exists()
    assert CheckpointLayout(tmp_path).next_index() == 8


def test_a_manifest_naming_a_file_outside_the_checkpoint_makes_it_corrupt(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 2)
    manifest = tmp_path / "AtomicDirectory_checkpoint_1" / "cycler_manifest.json"
    record = json.loads(manifest.read_text())
    record["files"] = {"../AtomicDirectory_checkpoint_0/model.pt": record["files"]["model.pt"]}
    manifest.write_text(json.dumps(record))
    rows = status_json(tmp_path)["checkpoints"]
    assert rows[1]["state"] == "corrupt" and "outside the checkpoint" in rows[1]["problem"]
    assert rows[0]["state"] == "latest"


def test_status_warns_about_a_latest_link_pointing_outside_the_root(tmp_path: Path) -> None:
    root, other = tmp_path / "root", tmp_path / "other"
    make_checkpoints(root, 3)
    make_checkpoints(other, 2)
    link = root / "AtomicDirectory.latest_checkpoint"
    link.unlink()
    os.symlink(other / "AtomicDirectory_checkpoint_1", link)
    report = status_json(root)
    assert any("points outside the root" in note for note in report["notes"])
    assert "points outside the root" in " ".join(status_text(root).split())


def test_a_same_size_bit_flip_in_the_latest_is_not_resumed_and_status_shows_it(
        tmp_path: Path) -> None:
    import warnings

    from cycler import CheckpointWarning, latest_checkpoint

    make_checkpoints(tmp_path, 2)
    model = tmp_path / "AtomicDirectory_checkpoint_1" / "model.pt"
    data = bytearray(model.read_bytes())
    data[10] ^= 0x01
    model.write_bytes(bytes(data))  # same size: only a checksum can tell
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert latest_checkpoint(tmp_path) == tmp_path / "AtomicDirectory_checkpoint_0"
    assert any(issubclass(w.category, CheckpointWarning) and "checksum" in str(w.message)
               for w in caught)
    rows = status_json(tmp_path)["checkpoints"]
    assert rows[1]["state"] == "corrupt" and "found when resuming" in rows[1]["problem"]


def test_status_leaves_out_events_whose_time_is_no_time(tmp_path: Path) -> None:
    # A line another tool or a broken disk wrote: status neither crashes nor counts it.
    make_checkpoints(tmp_path, 1)
    now = 1_700_000_000.0
    good = [{"time": now, "event": "start"}, {"time": now + 10, "event": "exit", "code": 0,
                                                "reason": "done"}]
    events = RunRecord(tmp_path).events_path(0)
    events.parent.mkdir(exist_ok=True)
    with events.open("w") as handle:
        handle.write(json.dumps(good[0]) + "\n")
        for when in ("1e300", "NaN", "Infinity", "-1e300", "-5", "\"soon\""):
            handle.write(f'{{"time": {when}, "event": "start"}}\n')
        handle.write(json.dumps(good[1]) + "\n")
    shown = status_json(tmp_path)
    assert [e["event"] for e in shown["events"]] == ["start", "exit"]
    assert shown["counts"]["starts"] == 1
    assert shown["goodput"]["wall"] == pytest.approx(10.0)
    result = runner.invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 0, result.output


def test_status_counts_one_stop_per_stop_however_often_its_path_changed(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 1)
    events = RunRecord(tmp_path).events_path(0)
    events.parent.mkdir(exist_ok=True)
    records = [("start", {}), ("stop_requested", {"path": "undecided"}),
               ("stop_requested", {"path": "next_commit"}),
               ("stop_requested", {"path": "signal"}), ("exit", {"code": 75}),
               ("start", {}), ("stop_requested", {"path": "agreed_step"}),
               ("exit", {"code": 75})]
    with events.open("w") as handle:
        for offset, (name, fields) in enumerate(records):
            handle.write(json.dumps({"time": 1e9 + offset, "event": name, **fields}) + "\n")
    assert status_json(tmp_path)["counts"]["stops"] == 2


def test_status_counts_the_checkpoints_only_in_memory_not_the_index_gaps(
        tmp_path: Path) -> None:
    root, memory = tmp_path / "ck", tmp_path / "memory"
    make_checkpoints(root, 1)  # index 0 persisted
    make_checkpoints(memory, 10)
    for index in (6, 7, 8):  # removed by the memory tier's retention
        shutil.rmtree(memory / f"AtomicDirectory_checkpoint_{index}")
    for private in (tmp_path, memory):  # a memory tier is listed only where it is private
        private.chmod(0o700)
    record = RunRecord(root).memory_tier_record_path
    record.write_text(json.dumps({"root": str(memory), "host": socket.gethostname()}))
    # The memory root's own record names this checkpoint root, as cycle run writes it.
    (memory / ".cycler").mkdir(exist_ok=True)
    (memory / ".cycler" / "memory-owner.json").write_text(
        json.dumps({"durable_root": os.path.realpath(root)}))
    shown = status_json(root)["memory"]
    assert (shown["newest"], shown["newest_persisted"]) == (9, 0)
    assert shown["lag"] == 6, "1-5 and 9 are only in memory; 6-8 are gone"


def test_status_lists_the_newest_checkpoints_and_counts_the_rest_unless_asked_for_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cycler_cli import render

    make_checkpoints(tmp_path, 14)
    (tmp_path / "AtomicDirectory_checkpoint_0" / "cycler_manifest.json").unlink()  # torn
    wide = {"COLUMNS": "200"}  # read where the console is made: in another test, under xdist
    monkeypatch.setattr(render.console, "width", 200)
    shown = runner.invoke(app, ["status", str(tmp_path)], env=wide).stdout
    listed = [int(line.split()[0]) for line in shown.splitlines()
              if line.strip() and line.split()[0].isdigit() and " B " in line]
    assert listed == list(range(4, 14)), shown
    assert "... and 4 older checkpoints (1 of them not valid); cycle status --all lists " \
           "every one" in shown
    every = runner.invoke(app, ["status", "--all", str(tmp_path)], env=wide).stdout
    assert "older checkpoints" not in every
    assert sum(1 for line in every.splitlines() if " B " in line) == 14, every
