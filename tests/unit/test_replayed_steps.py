"""Step fingerprints and the check of a restart's replayed steps: the record format, the pure
comparison core, the worker's log, the supervisor's decision, and the supervisor's watch over a
node's files (no process, no sleep)."""

from __future__ import annotations

import math
import os
import signal
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from cycler.errors import ConfigError
from cycler.protocol.exit_codes import EXIT_DIVERGED
from cycler.protocol.fingerprints import (
    FLOAT32,
    FLOAT64,
    RANK_FILE,
    RECORD_SIZE,
    START,
    VALUE,
    Record,
    float64_bits,
    pack,
    read_records,
    unpack,
    value_of,
)
from cycler.protocol.replay import (
    DIVERGED,
    FIRST_STEP_CAUSE,
    UNCHECKED,
    VERIFIED,
    Segment,
    compare,
    reference,
    segments,
    verdict,
)
from cycler.supervisor.configuration.options import RunOptions
from cycler.supervisor.decisions.core import (
    CoreConfig,
    Exit,
    Phase,
    ReplayDiverged,
    SignalReceived,
    SignalTree,
    SupervisorCore,
    WorkersExited,
)
from cycler.supervisor.watch.replay_watch import ReplayWatch
from cycler.training.fingerprints import FingerprintLog, tensor_bits


def run(rank: int, start: int, resumed: int, losses: dict[int, float],
        world: int = 1) -> list[Record]:
    """The records of one worker process: its header, then a float64 loss per step."""
    return [Record(START, rank, start, resumed, world),
            *(Record(VALUE, rank, start, step, float64_bits(loss), FLOAT64)
              for step, loss in losses.items())]


def losses(first: int, last: int, shift: float = 0.0) -> dict[int, float]:
    return {step: 1.0 / step + shift for step in range(first, last + 1)}


def judge(records: list[Record]) -> Any:
    """The newest segment of each rank against its reference, as the supervisor judges it."""
    ordered = segments(records)
    newest = {s.rank: i for i, s in enumerate(ordered)}
    found = []
    for index in newest.values():
        before = reference(ordered[:index], ordered[index])
        if before is not None:
            found.append(compare(before, ordered[index]))
    return verdict(found)


# -- the record format -----------------------------------------------------------------------

def test_records_come_back_as_they_were_packed() -> None:
    records = run(3, 0xFFFF_FFFF, -1, {1: 0.5, 2: -0.0})
    assert unpack(b"".join(map(pack, records))) == (records, RECORD_SIZE * 3)


def test_a_torn_record_costs_that_record_only_and_the_next_start_appends_after_it(
        tmp_path: Path) -> None:
    path = tmp_path / "rank-0.fp"
    first, second = run(0, 1, -1, {1: 0.5, 2: 0.25}), run(0, 2, 1, {2: 0.25})
    torn = pack(first[2])[:RECORD_SIZE // 2]  # a kill -9 mid-append
    path.write_bytes(b"".join(map(pack, first[:2])) + torn + b"".join(map(pack, second)))
    assert read_records(path)[0] == first[:2] + second


def test_a_record_still_being_written_is_read_whole_at_the_next_look(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.fp"
    data = b"".join(map(pack, run(0, 1, -1, {1: 0.5})))
    path.write_bytes(data[:RECORD_SIZE + 5])
    records, offset = read_records(path)
    assert len(records) == 1 and offset == RECORD_SIZE
    path.write_bytes(data)
    assert read_records(path, offset)[0] == [run(0, 1, -1, {1: 0.5})[1]]


def test_float_values_are_their_exact_bits_not_their_printed_decimals() -> None:
    a = 0.1 + 0.2
    b = 0.30000000000000004 - 2 ** -54  # the next float down: prints alike at 16 digits
    assert f"{a:.15g}" == f"{b:.15g}" and a != b
    found = judge(run(0, 1, 0, {1: 9.0, 2: a}) + run(0, 2, 0, {1: 9.0, 2: b}))
    assert found.verdict == DIVERGED and found.step == 2 and found.now != found.before


def test_nan_losses_with_the_same_bits_are_identical_and_other_nans_differ() -> None:
    nan, other = float64_bits(math.nan), float64_bits(math.nan) | 1
    same = [Record(START, 0, s, 0, 1) for s in (1, 2)] + [
        Record(VALUE, 0, s, 1, nan, FLOAT64) for s in (1, 2)]
    assert judge(same).verdict == VERIFIED
    found = judge([*same[:3], Record(VALUE, 0, 2, 1, other, FLOAT64)])
    assert found.verdict == DIVERGED and "nan (bits" in found.now


def test_every_type_of_value_reads_back_as_its_number() -> None:
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        kind, bits = tensor_bits(torch.tensor(0.3, dtype=dtype))
        assert value_of(kind, bits) == torch.tensor(0.3, dtype=dtype).item()
    assert value_of(*tensor_bits(torch.tensor(-7))) == -7


# -- the comparison core ---------------------------------------------------------------------

def test_a_restart_that_replays_every_step_exactly_is_verified() -> None:
    found = judge(run(0, 1, -1, losses(1, 13)) + run(0, 2, 10, losses(11, 20)))
    assert (found.verdict, found.resumed, found.steps, found.complete) == (VERIFIED, 10, 3, True)
    assert found.sentence() == "resume at step 10 verified: 3 replayed steps identical (1 rank)"


def test_a_first_replayed_step_that_differs_blames_the_restored_state() -> None:
    found = judge(run(0, 1, -1, losses(1, 13)) + run(0, 2, 10, losses(11, 20, shift=1e-9)))
    assert (found.verdict, found.step, found.steps) == (DIVERGED, 11, 0)
    assert found.cause == FIRST_STEP_CAUSE
    assert found.sentence().startswith("resume at step 10 diverged at step 11 on rank 0 (loss ")


def test_a_later_step_that_differs_blames_nondeterminism() -> None:
    replay = {**losses(11, 12), **losses(13, 20, shift=1e-9)}
    found = judge(run(0, 1, -1, losses(1, 14)) + run(0, 2, 10, replay))
    assert (found.verdict, found.step, found.steps) == (DIVERGED, 13, 2)
    assert found.cause.startswith("2 replayed steps were identical before it: nondeterminism")


def test_a_restart_that_repeats_earlier_steps_is_told_so() -> None:
    found = judge(run(0, 1, -1, losses(1, 13)) + run(0, 2, 10, {11: 1.0 / 3, 12: 0.25}))
    assert found.verdict == DIVERGED and "computed exactly what step 3 computed" in found.cause


def test_the_earliest_difference_over_the_ranks_is_the_verdict() -> None:
    records = (run(0, 1, -1, losses(1, 13)) + run(1, 2, -1, losses(1, 13))
               + run(0, 3, 10, {**losses(11, 12), 13: 5.0}) + run(1, 4, 10, {11: 5.0}))
    found = judge(records)
    assert (found.step, found.rank, found.ranks) == (11, 1, 2)


def test_two_restarts_in_a_row_compare_with_both_earlier_runs() -> None:
    # Killed at 37 (checkpoint 30), then at 33 before the next checkpoint, then resumed at 30.
    records = (run(0, 1, -1, losses(1, 37)) + run(0, 2, 30, losses(31, 33))
               + run(0, 3, 30, {**losses(31, 35), 36: 0.0}))
    found = judge(records)
    assert (found.verdict, found.step, found.steps) == (DIVERGED, 36, 5)


def test_a_resume_from_an_older_checkpoint_compares_with_the_run_that_passed_it() -> None:
    # The newest checkpoint (40) is unusable: the restart resumes at 20. The run that resumed
    # at 40 never computed steps 21-40, so only the first run is the reference.
    records = (run(0, 1, -1, losses(1, 50)) + run(0, 2, 40, losses(41, 60, shift=3.0))
               + run(0, 3, 20, losses(21, 45)))
    found = judge(records)
    assert (found.verdict, found.resumed, found.steps) == (VERIFIED, 20, 25)
    assert not found.complete, "steps 46-50 were not replayed yet"


def test_a_world_size_change_is_said_not_compared() -> None:
    found = judge(run(0, 1, -1, losses(1, 13), world=4) + run(0, 2, 10, losses(11, 13), world=2))
    assert found.verdict == UNCHECKED and "world size changed from 4 to 2" in found.sentence()


def test_a_script_that_reports_no_loss_claims_nothing() -> None:
    assert judge([Record(START, 0, 1, -1, 1), Record(START, 0, 2, 10, 1)]) is None
    assert judge(run(0, 1, -1, losses(1, 13))) is None, "a first run replays nothing"


def test_values_before_their_header_and_records_read_twice_count_once() -> None:
    first = run(0, 1, -1, losses(1, 3))
    (segment,) = segments([first[2], *first, *first])
    assert segment.values.keys() == {1, 2, 3} and segment.resumed == -1


def test_a_reference_keeps_only_the_steps_after_the_resume() -> None:
    earlier = segments(run(0, 1, -1, losses(1, 13)), after=10)
    merged = reference(earlier, Segment(0, 2, 10, 1))
    assert merged is not None and sorted(merged.values) == [11, 12, 13]


# -- the worker's log ------------------------------------------------------------------------

def test_the_worker_log_writes_a_header_then_each_steps_exact_bits(tmp_path: Path) -> None:
    path = tmp_path / RANK_FILE.format(rank=2)
    log = FingerprintLog(path, rank=2, world_size=4)
    loss = torch.tensor(0.1, dtype=torch.float32, requires_grad=True) * 3
    log.record(11, 10, loss)
    log.record(12, 10, 0.25)
    log.record(13, 10, 12345)
    header, *values = read_records(path)[0]  # stored at once: nothing waits for a flush
    assert (header.kind, header.step, header.bits, header.rank) == (START, 10, 4, 2)
    assert values[0].type == FLOAT32
    assert values[0].bits == struct.unpack("<I", struct.pack("<f", loss.item()))[0]
    assert [value_of(v.type, v.bits) for v in values[1:]] == [0.25, 12345]
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_a_loss_of_several_elements_is_refused_in_one_line(tmp_path: Path) -> None:
    log = FingerprintLog(tmp_path / "rank-0.fp")
    with pytest.raises(ConfigError, match="one element"):
        log.record(1, 0, torch.ones(3))
    with pytest.raises(ConfigError, match="a float, an int or a one-element tensor"):
        log.record(1, 0, "0.5")


def test_a_second_start_stores_after_the_first_and_a_reader_skips_the_mapped_tail(
        tmp_path: Path) -> None:
    path = tmp_path / "rank-0.fp"
    first = FingerprintLog(path)
    first.record(1, 0, 0.5)
    assert path.stat().st_size > 2 * RECORD_SIZE, "mapped ahead: the tail is zeros"
    second = FingerprintLog(path)
    second.record(1, 0, 0.25)
    records, offset = read_records(path)
    assert [(r.kind, r.step) for r in records] == [(START, 0), (VALUE, 1)] * 2
    assert records[1].bits != records[3].bits and records[0].start != records[2].start
    assert offset < path.stat().st_size


def test_outside_cycle_run_nothing_is_recorded(tmp_path: Path) -> None:
    FingerprintLog(None).record(1, 0, 0.5)
    assert list(tmp_path.iterdir()) == []


# -- the supervisor's decision ---------------------------------------------------------------

def test_a_divergence_that_must_stop_the_job_kills_the_workers_and_exits_65() -> None:
    core = SupervisorCore(CoreConfig(grace=30.0))
    core.start(0.0)
    assert core.handle(ReplayDiverged("diverged at step 11", 1.0)) == [SignalTree(signal.SIGKILL)]
    assert core.phase is Phase.KILLED
    actions = core.handle(WorkersExited(-9, 2.0))
    assert Exit(EXIT_DIVERGED, "diverged at step 11 (--on-divergence stop)", False) in actions


def test_a_divergence_during_a_stop_leaves_the_stop_alone() -> None:
    core = SupervisorCore(CoreConfig(grace=30.0))
    core.start(0.0)
    core.handle(SignalReceived("SIGTERM", 1.0))
    assert core.handle(ReplayDiverged("diverged", 2.0)) == []


def test_on_divergence_takes_warn_or_stop_only() -> None:
    assert RunOptions(script="t.py", on_divergence="stop").on_divergence == "stop"
    with pytest.raises(ConfigError, match="on-divergence must be one of warn, stop"):
        RunOptions(script="t.py", on_divergence="halt")


# -- the supervisor's watch over the node's files -------------------------------------------

def watch(tmp_path: Path, said: list[tuple[str, dict[str, Any]]], stop: bool = False,
          ranks: int = 1) -> ReplayWatch:
    from cycler.protocol.record import RunRecord

    run_record = RunRecord(tmp_path / "ck")
    run_record.directory.mkdir(parents=True)
    (tmp_path / "node").mkdir()
    return ReplayWatch(run_record, 0, lambda: tmp_path / "node", stop=stop, local_ranks=ranks,
                       record=lambda event, warning=False, **fields: said.append((event, fields)))


def append(path: Path, records: list[Record]) -> None:
    with open(path, "ab") as handle:
        handle.write(b"".join(map(pack, records)))


def test_the_watch_says_a_verified_restart_once_and_copies_the_records_to_the_root(
        tmp_path: Path) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    replays = watch(tmp_path, said)
    replays.new_start()
    node_file = tmp_path / "node" / "rank-0.fp"
    append(node_file, run(0, 1, -1, losses(1, 13)))
    assert replays.check(1.0) is None and said == []
    replays.new_start()  # killed at 13: the records reach the root
    shared = tmp_path / "ck" / ".cycler" / "fingerprints-node0.fp"
    assert len(read_records(shared)[0]) == 14
    append(node_file, run(0, 2, 10, losses(11, 12)))
    replays.check(2.0)
    assert said == [], "step 13 is not replayed yet"
    append(node_file, run(0, 2, 10, losses(13, 14))[1:])
    replays.check(3.0)
    replays.check(4.0)
    assert [event for event, _ in said] == ["replay_verified"]
    assert said[0][1]["steps"] == 3


def test_the_watch_reads_an_earlier_node_s_records_from_the_root(tmp_path: Path) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    replays = watch(tmp_path, said)
    append(tmp_path / "ck" / ".cycler" / "fingerprints-node0.fp", run(0, 1, -1, losses(1, 13)))
    replays.new_start()  # requeued on a fresh node: nothing of the earlier run is local
    append(tmp_path / "node" / "rank-0.fp", run(0, 2, 10, losses(11, 12, shift=1.0)))
    assert replays.check(10.0) is None, "warn: nothing to end"
    assert said[0][0] == "replay_diverged" and said[0][1]["step"] == 11


def test_with_stop_the_watch_hands_the_divergence_to_the_core(tmp_path: Path) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    replays = watch(tmp_path, said, stop=True)
    replays.new_start()
    append(tmp_path / "node" / "rank-0.fp", run(0, 1, -1, losses(1, 13)))
    replays.new_start()
    append(tmp_path / "node" / "rank-0.fp", run(0, 2, 10, {11: 0.0}))
    found = replays.check(5.0)
    assert found is not None and found.verdict == DIVERGED


def test_a_restart_that_ends_before_replaying_everything_says_what_it_compared(
        tmp_path: Path) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    replays = watch(tmp_path, said, ranks=2)
    replays.new_start()
    for rank in (0, 1):
        append(tmp_path / "node" / f"rank-{rank}.fp", run(rank, rank + 1, -1, losses(1, 13)))
    replays.new_start()
    append(tmp_path / "node" / "rank-0.fp", run(0, 5, 10, losses(11, 12)))
    replays.end_of_group()  # rank 1 never started again; rank 0 stopped at 12
    assert said[0][0] == "replay_verified"
    assert said[0][1]["said"] == ("resume at step 10 verified: 2 replayed steps identical "
                                  "(1 rank); the run ended before it replayed the rest")


def test_a_malformed_copy_record_or_an_unreadable_file_never_ends_the_supervisor(
        tmp_path: Path) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    replays = watch(tmp_path, said)
    replays.new_start()
    append(tmp_path / "node" / "rank-0.fp", run(0, 1, -1, losses(1, 13)))
    (tmp_path / "node" / "flushed.json").write_text('{"rank-0.fp": "many"}')
    replays.flush()  # copies from the start again: a record read twice counts once
    assert len(read_records(tmp_path / "ck" / ".cycler" / "fingerprints-node0.fp")[0]) == 14
    (tmp_path / "node" / "rank-1.fp").mkdir()  # not a file: every read of it fails
    replays.flush()
    assert replays.check(100.0) is None


def test_a_new_cycle_run_does_not_say_again_what_the_last_one_said(tmp_path: Path) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    replays = watch(tmp_path, said)
    append(tmp_path / "node" / "rank-0.fp",
           run(0, 1, -1, losses(1, 13)) + run(0, 2, 10, losses(11, 20)))
    replays.new_start()  # the last cycle run said its verdict, and was killed before a copy
    replays.check(1.0)
    assert said == []
    assert len(read_records(tmp_path / "ck" / ".cycler" / "fingerprints-node0.fp")[0]) == 25


def test_a_finished_job_leaves_its_records_in_the_root_only_and_private_files_meanwhile(
        tmp_path: Path) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    replays = watch(tmp_path, said)
    replays.new_start()
    append(tmp_path / "node" / "rank-0.fp", run(0, 1, -1, losses(1, 3)))
    replays.flush()
    assert os.stat(tmp_path / "node" / "flushed.json").st_mode & 0o777 == 0o600
    replays.finish(75)
    assert (tmp_path / "node").is_dir(), "a requeued job replays from these"
    replays.finish(0)
    assert not (tmp_path / "node").exists()
    assert len(read_records(tmp_path / "ck" / ".cycler" / "fingerprints-node0.fp")[0]) == 4
