"""RunRecord: every path under a root's ``.cycler/``, named as docs/layout-on-disk.md lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from cycler.errors import CheckpointDirectoryError
from cycler.protocol.record import RunRecord, is_record_directory


def test_every_record_keeps_its_name_and_place_on_disk(tmp_path: Path) -> None:
    record, here = RunRecord(tmp_path), tmp_path / ".cycler"
    assert record.directory == here
    assert {
        record.control_path(2): "control-node2.json",
        record.events_path(2): "events-node2.jsonl",
        record.lock_path(2): "supervisor-node2.lock",
        record.heartbeat_path(2): "alive-node2.json",
        record.progress_dir(2): "progress-node2",
        record.workers_finished_path(2): "finished-node2",
        record.hang_record_path(2): "hang-node2.json",
        record.hang_dump_dir("20261128-040000"): "hang-20261128-040000",
        record.resume_record_path(2): "resumed-from-node2.json",
        record.stderr_log_path(2): "stderr-node2.log",
        record.fingerprints_path(2): "fingerprints-node2.fp",
        record.liveness_store_path: "liveness-store.json",
        record.job_id_path: "job-id",
        record.memory_tier_record_path: "memory-tier.json",
        record.memory_overflow_path: "memory-tier-overflow.json",
        record.memory_owner_path: "memory-owner.json",
        record.compile_cache_path: "compile-cache.tar",
        record.writer_lock_path("model"): "model.writer.lock",
        record.index_record_path("model"): "model.last_index",
        record.first_index_record_path("model"): "model.first_index",
        record.verification_record_path("model_checkpoint_3"): "verify-failed-model_checkpoint_3",
    } == {here / name: name for name in (
        "control-node2.json", "events-node2.jsonl", "supervisor-node2.lock", "alive-node2.json",
        "progress-node2", "finished-node2", "hang-node2.json", "hang-20261128-040000",
        "resumed-from-node2.json", "stderr-node2.log", "fingerprints-node2.fp",
        "liveness-store.json", "job-id", "memory-tier.json", "memory-tier-overflow.json",
        "memory-owner.json", "compile-cache.tar", "model.writer.lock", "model.last_index",
        "model.first_index", "verify-failed-model_checkpoint_3")}


def test_a_relative_root_is_kept_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert RunRecord("ck").control_path(0) == tmp_path / "ck" / ".cycler" / "control-node0.json"


def test_every_node_s_files_are_found_by_rank_and_nothing_else_is(tmp_path: Path) -> None:
    record = RunRecord(tmp_path)
    record.directory.mkdir()
    for name in ("events-node0.jsonl", "events-node10.jsonl", "events-nodex.jsonl",
                 "control-node1.json", "control-node0.json", "supervisor-node3.lock",
                 "finished-node4", "finished-node1", "finished-node", "events-node2.json"):
        (record.directory / name).touch()
    assert record.events_paths() == {0: record.events_path(0), 10: record.events_path(10)}
    assert record.control_paths() == [record.control_path(0), record.control_path(1)]
    assert record.lock_paths() == [record.lock_path(3)]
    assert record.workers_finished_nodes() == [1, 4]


def test_verification_records_are_found_by_checkpoint_name(tmp_path: Path) -> None:
    record = RunRecord(tmp_path)
    assert record.verification_records() == {}
    record.directory.mkdir()
    record.verification_record_path("a_checkpoint_1").touch()
    (record.directory / "alive-node0.json").touch()
    assert record.verification_records() == {
        "a_checkpoint_1": record.directory / "verify-failed-a_checkpoint_1"}


def test_a_record_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / ".cycler").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointDirectoryError, match="is a symlink"):
        RunRecord(tmp_path / "root").check_directory()
    RunRecord(tmp_path).check_directory()  # absent: nothing to refuse


def test_only_the_record_directory_s_own_name_is_taken_for_it() -> None:
    assert is_record_directory(".cycler")
    assert not is_record_directory("cycler") and not is_record_directory(".cycler2")
