"""`cycle run` under a real Slurm, submitted with scripts/slurm/single_node.sbatch as a user
would: an outside `scontrol requeue`, a preemption by a higher-priority partition, the time-limit
notice, and a scancel; and an outside requeue of scripts/slurm/multi_node.sbatch on one node,
where `cycle run` runs in an srun step. Each stop commits a checkpoint at the agreed step, the
job ends with weights bit-identical to an uninterrupted run, and no process of it is left
behind. Run with proctrack/cgroup (only the batch shell gets Slurm's TERM) and proctrack/pgid
(its whole process group does, and torchrun is in a session of its own), and, for the outside
requeue, with proctrack/linuxproc, which sends the TERM to every process of the job, DataLoader
workers included, both for examples/train.py (StepControl) and for a script that only commits
through the savers.

Not part of the default run: ``python -m pytest -m slurm tests/slurm`` (as root, with Debian's
slurmctld, slurmd, slurm-client and munge installed)."""

from __future__ import annotations

import pytest
import torch
from slurm_jobs import Outcome

from cycler import EXIT_REQUEUE, EXIT_SUCCESS

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


def assert_stopped_at_a_checkpoint_then_finished(outcome: Outcome) -> None:
    codes = [run.code for run in outcome.runs()]
    assert codes == [EXIT_REQUEUE, EXIT_SUCCESS], f"{codes}\n{outcome.log}"
    stop = outcome.runs()[0]
    assert stop.commit_after_signal is not None, f"no checkpoint after the signal\n{outcome.log}"
    assert "stopping at step" in outcome.log, outcome.log
    assert "resumed from" in outcome.log, outcome.log


def assert_deadline_from_slurm(outcome: Outcome) -> None:
    """The stop's deadline came from Slurm, not the grace: the time limit read at the notice, or,
    where slurmctld delivered the notice late (at load 5-6 on 2 cores the job was already at its
    limit: "JOB 1 ... CANCELLED AT", JobState=SIGNALING), Slurm's KillWait after its signal."""
    deadlines = outcome.event_lines("deadline")
    assert deadlines, outcome.log
    why = str(deadlines[0]["why"])
    assert "time limit" in why or ("Slurm is ending the job" in why and "KillWait" in why), \
        f"{deadlines}\n{outcome.log}"


def assert_bit_identical(
        outcome: Outcome, reference: dict[str, torch.Tensor]) -> None:
    assert outcome.final_weights.exists(), f"no final weights\n{outcome.log}"
    resumed = torch.load(outcome.final_weights, weights_only=True)
    assert resumed.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(resumed[name], tensor), f"{name} differs\n{outcome.log}"


def assert_cycle_did_not_requeue(outcome: Outcome) -> None:
    """Slurm was already ending the job: cycle must not requeue it a second time."""
    accepted = [event for event in outcome.event_lines("requeue") if event.get("accepted")]
    assert not accepted, accepted


@pytest.mark.scenario("requeue")
def test_an_outside_scontrol_requeue_reruns_the_job_from_its_stop_checkpoint(
        outcome: Outcome, reference: dict[str, torch.Tensor]) -> None:
    assert "DUE TO JOB REQUEUE" in outcome.log, outcome.log
    assert_stopped_at_a_checkpoint_then_finished(outcome)
    assert_cycle_did_not_requeue(outcome)
    assert (outcome.fields["JobState"], outcome.fields["Restarts"]) == ("COMPLETED", "1")
    assert_bit_identical(outcome, reference)
    assert not outcome.survivors


@pytest.mark.scenario("multi_node")
def test_the_multi_node_template_runs_cycle_in_an_srun_step_that_an_outside_requeue_reruns(
        outcome: Outcome, reference: dict[str, torch.Tensor]) -> None:
    assert "DUE TO JOB REQUEUE" in outcome.log, outcome.log
    assert_stopped_at_a_checkpoint_then_finished(outcome)
    assert_cycle_did_not_requeue(outcome)
    assert (outcome.fields["JobState"], outcome.fields["Restarts"]) == ("COMPLETED", "1")
    assert_bit_identical(outcome, reference)
    assert not outcome.survivors


@pytest.mark.scenario("preemption")
def test_a_preemption_by_the_urgent_partition_reruns_the_job_from_its_stop_checkpoint(
        outcome: Outcome, reference: dict[str, torch.Tensor]) -> None:
    assert "DUE TO PREEMPTION" in outcome.log, outcome.log
    assert_stopped_at_a_checkpoint_then_finished(outcome)
    assert_cycle_did_not_requeue(outcome)
    assert (outcome.fields["JobState"], outcome.fields["Restarts"]) == ("COMPLETED", "1")
    assert outcome.notes["urgent"]["JobState"] == "COMPLETED", outcome.notes["urgent"]
    assert_bit_identical(outcome, reference)
    assert not outcome.survivors


@pytest.mark.scenario("time_limit")
def test_the_time_limit_notice_makes_cycle_requeue_the_job_after_its_stop_checkpoint(
        outcome: Outcome, reference: dict[str, torch.Tensor]) -> None:
    assert_stopped_at_a_checkpoint_then_finished(outcome)
    requeues = outcome.event_lines("requeue")
    assert [event.get("accepted") for event in requeues] == [True], f"{requeues}\n{outcome.log}"
    assert f"cycle: scontrol requeue {outcome.job_id}" in outcome.log, outcome.log
    assert_deadline_from_slurm(outcome)
    assert (outcome.fields["JobState"], outcome.fields["Restarts"]) == ("COMPLETED", "1")
    assert_bit_identical(outcome, reference)
    assert not outcome.survivors


@pytest.mark.scenario("scancel")
def test_a_scancel_stops_at_a_checkpoint_and_the_job_stays_cancelled(
        outcome: Outcome, reference: dict[str, torch.Tensor]) -> None:
    assert_stopped_at_a_checkpoint_then_finished(outcome)
    assert_cycle_did_not_requeue(outcome)
    for fields in (outcome.fields, outcome.notes["later"]):
        assert (fields["JobState"], fields["Restarts"]) == ("CANCELLED", "0"), fields
    assert outcome.notes["rerun"]["JobState"] == "COMPLETED", outcome.log
    assert_bit_identical(outcome, reference)
    assert not outcome.survivors


@pytest.mark.proctrack("linuxproc")
@pytest.mark.scenario("requeue")
def test_a_term_that_slurm_sends_to_every_process_of_the_job_kills_nothing_before_the_checkpoint(
        outcome: Outcome, reference: dict[str, torch.Tensor]) -> None:
    strays = [line for line in outcome.log.splitlines() if "directly; ignored" in line]
    # torchrun, the worker and its DataLoader worker each heard it, and said so once.
    assert len(strays) >= 3, outcome.log
    assert_stopped_at_a_checkpoint_then_finished(outcome)
    assert (outcome.fields["JobState"], outcome.fields["Restarts"]) == ("COMPLETED", "1")
    assert_bit_identical(outcome, reference)
    assert not outcome.survivors


@pytest.mark.proctrack("linuxproc")
@pytest.mark.scenario("saver_only")
def test_a_saver_only_script_under_linuxproc_makes_its_stop_checkpoint_at_its_next_commit(
        outcome: Outcome, saver_only_reference: dict[str, torch.Tensor]) -> None:
    # Issue 17: the script has no StepControl; the TERM reached every process of the job, and
    # the worker lived on to its next commit, which cycle then ended it after.
    strays = [line for line in outcome.log.splitlines() if "directly; ignored" in line]
    assert len(strays) >= 2, outcome.log  # torchrun and the worker at least
    codes = [run.code for run in outcome.runs()]
    assert codes == [EXIT_REQUEUE, EXIT_SUCCESS], f"{codes}\n{outcome.log}"
    stop = outcome.runs()[0]
    assert stop.commit_after_signal is not None, f"no checkpoint after the signal\n{outcome.log}"
    names = [event["event"] for event in outcome.events]
    assert "stop_after_commit" in names and "stop_without_new_checkpoint" not in names, names
    assert "Traceback" not in outcome.log, outcome.log
    assert (outcome.fields["JobState"], outcome.fields["Restarts"]) == ("COMPLETED", "1")
    assert_bit_identical(outcome, saver_only_reference)
    assert not outcome.survivors
