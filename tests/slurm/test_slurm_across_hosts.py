"""`cycle run` across two hosts under a real Slurm: one slurmd in each of two network namespaces
(h1 and h2, one address each, the checkpoint directory on the filesystem both see), a job
submitted with scripts/slurm/multi_node.sbatch and ``--nodes=2`` as a user would, so that srun
starts one `cycle run` on each host with its node rank from ``$SLURM_NODEID`` and the rendezvous
at h1. An outside `scontrol requeue`, a preemption by a higher-priority partition and the
time-limit notice each stop both nodes at one checkpoint; the job reruns on both hosts and ends
bit-identical to the same training uninterrupted, and no process of it is left on either host.

Not part of the default run: ``python -m pytest -m slurm tests/slurm`` (as root, with Debian's
slurmctld, slurmd, slurm-client, munge and iproute2 installed)."""

from __future__ import annotations

import pytest
import torch
from slurm_jobs import Outcome, runs_of
from test_slurm_stops import (
    assert_bit_identical,
    assert_cycle_did_not_requeue,
    assert_stopped_at_a_checkpoint_then_finished,
)

from cycler import EXIT_REQUEUE, EXIT_SUCCESS

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


def assert_ran_on_both_hosts_and_every_node_stopped_then_finished(outcome: Outcome) -> None:
    assert (outcome.fields["NodeList"], outcome.fields["NumNodes"]) == ("h[1-2]", "2"), \
        outcome.fields
    assert_stopped_at_a_checkpoint_then_finished(outcome)
    for node, events in enumerate(outcome.every_node_events()):
        codes = [run.code for run in runs_of(events)]
        assert codes == [EXIT_REQUEUE, EXIT_SUCCESS], f"node {node}: {codes}\n{outcome.log}"
    assert (outcome.fields["JobState"], outcome.fields["Restarts"]) == ("COMPLETED", "1")


@pytest.mark.scenario("requeue")
def test_an_outside_requeue_of_a_two_host_job_reruns_both_nodes_from_their_stop_checkpoint(
        outcome_across_hosts: Outcome, two_rank_weights: dict[str, torch.Tensor]) -> None:
    outcome = outcome_across_hosts
    assert "DUE TO JOB REQUEUE" in outcome.log, outcome.log
    assert_ran_on_both_hosts_and_every_node_stopped_then_finished(outcome)
    assert_cycle_did_not_requeue(outcome)
    assert_bit_identical(outcome, two_rank_weights)
    assert not outcome.survivors


@pytest.mark.scenario("preemption")
def test_a_preemption_of_a_two_host_job_reruns_both_nodes_from_their_stop_checkpoint(
        outcome_across_hosts: Outcome, two_rank_weights: dict[str, torch.Tensor]) -> None:
    outcome = outcome_across_hosts
    assert "DUE TO PREEMPTION" in outcome.log, outcome.log
    assert_ran_on_both_hosts_and_every_node_stopped_then_finished(outcome)
    assert_cycle_did_not_requeue(outcome)
    assert outcome.notes["urgent"]["JobState"] == "COMPLETED", outcome.notes["urgent"]
    assert_bit_identical(outcome, two_rank_weights)
    assert not outcome.survivors


@pytest.mark.scenario("time_limit")
def test_the_time_limit_notice_on_both_hosts_makes_node_0_requeue_the_job_after_the_checkpoint(
        outcome_across_hosts: Outcome, two_rank_weights: dict[str, torch.Tensor]) -> None:
    outcome = outcome_across_hosts
    assert_ran_on_both_hosts_and_every_node_stopped_then_finished(outcome)
    requeues = outcome.event_lines("requeue")
    assert [event.get("accepted") for event in requeues] == [True], f"{requeues}\n{outcome.log}"
    assert f"cycle: scontrol requeue {outcome.job_id}" in outcome.log, outcome.log
    deadlines = outcome.event_lines("deadline")
    assert deadlines and "time limit" in deadlines[0]["why"], f"{deadlines}\n{outcome.log}"
    assert_bit_identical(outcome, two_rank_weights)
    assert not outcome.survivors
