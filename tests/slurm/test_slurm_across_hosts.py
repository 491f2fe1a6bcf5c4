"""`cycle run` across hosts under a real Slurm: one slurmd in each of N network namespaces
(h1, h2, ..., one address each, the checkpoint directory on the filesystem all see), a job
submitted with scripts/slurm/multi_node.sbatch and ``--nodes=N`` as a user would, so that srun
starts one `cycle run` on each host with its node rank from ``$SLURM_NODEID`` and the rendezvous
at h1. An outside `scontrol requeue`, a preemption by a higher-priority partition and the
time-limit notice each stop every node at one checkpoint; the job reruns on every host and ends
bit-identical to the same training uninterrupted, and no process of it is left on any host.

N is 2 for every scenario; the outside requeue also runs on 4 hosts, marked ``slow`` (a cluster
of its own, ~2 minutes on 2 cores): ``python -m pytest -m 'slurm and slow' tests/slurm``.

Not part of the default run: ``python -m pytest -m 'slurm and not slow' tests/slurm`` (as root,
with Debian's slurmctld, slurmd, slurm-client, munge and iproute2 installed)."""

from __future__ import annotations

import pytest
import torch
from slurm_hosts import node_list
from slurm_jobs import Outcome, runs_of
from test_slurm_stops import (
    assert_bit_identical,
    assert_cycle_did_not_requeue,
    assert_deadline_from_slurm,
    assert_stopped_at_a_checkpoint_then_finished,
)

from cycler import EXIT_REQUEUE, EXIT_SUCCESS

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

TWO_HOSTS = pytest.mark.parametrize("nnodes", [2], indirect=True, scope="module")
"""Every test names its number of hosts, so that the tests of one number share one cluster."""


def assert_ran_on_every_host_and_every_node_stopped_then_finished(outcome: Outcome,
                                                                  nnodes: int) -> None:
    assert (outcome.fields["NodeList"], outcome.fields["NumNodes"]) == \
        (node_list(nnodes), str(nnodes)), outcome.fields
    assert_stopped_at_a_checkpoint_then_finished(outcome)
    for node, events in enumerate(outcome.every_node_events()):
        codes = [run.code for run in runs_of(events)]
        assert codes == [EXIT_REQUEUE, EXIT_SUCCESS], f"node {node}: {codes}\n{outcome.log}"
    assert (outcome.fields["JobState"], outcome.fields["Restarts"]) == ("COMPLETED", "1")


@pytest.mark.parametrize("nnodes", [2, pytest.param(4, marks=pytest.mark.slow)],
                         indirect=True, scope="module")
@pytest.mark.scenario("requeue")
def test_an_outside_requeue_of_a_job_across_hosts_reruns_every_node_from_its_stop_checkpoint(
        outcome_across_hosts: Outcome, weights_across_hosts: dict[str, torch.Tensor],
        nnodes: int) -> None:
    outcome = outcome_across_hosts
    assert "DUE TO JOB REQUEUE" in outcome.log, outcome.log
    assert_ran_on_every_host_and_every_node_stopped_then_finished(outcome, nnodes)
    assert_cycle_did_not_requeue(outcome)
    assert_bit_identical(outcome, weights_across_hosts)
    assert not outcome.survivors


@TWO_HOSTS
@pytest.mark.scenario("preemption")
def test_a_preemption_of_a_two_host_job_reruns_both_nodes_from_their_stop_checkpoint(
        outcome_across_hosts: Outcome, weights_across_hosts: dict[str, torch.Tensor],
        nnodes: int) -> None:
    outcome = outcome_across_hosts
    assert "DUE TO PREEMPTION" in outcome.log, outcome.log
    assert_ran_on_every_host_and_every_node_stopped_then_finished(outcome, nnodes)
    assert_cycle_did_not_requeue(outcome)
    assert outcome.notes["urgent"]["JobState"] == "COMPLETED", outcome.notes["urgent"]
    assert_bit_identical(outcome, weights_across_hosts)
    assert not outcome.survivors


@TWO_HOSTS
@pytest.mark.scenario("time_limit")
def test_the_time_limit_notice_on_both_hosts_makes_node_0_requeue_the_job_after_the_checkpoint(
        outcome_across_hosts: Outcome, weights_across_hosts: dict[str, torch.Tensor],
        nnodes: int) -> None:
    outcome = outcome_across_hosts
    assert_ran_on_every_host_and_every_node_stopped_then_finished(outcome, nnodes)
    requeues = outcome.event_lines("requeue")
    assert [event.get("accepted") for event in requeues] == [True], f"{requeues}\n{outcome.log}"
    assert f"cycle: scontrol requeue {outcome.job_id}" in outcome.log, outcome.log
    assert_deadline_from_slurm(outcome)
    assert_bit_identical(outcome, weights_across_hosts)
    assert not outcome.survivors
