"""The ways Slurm stops a job, each driven to its end on a real cluster.

The time limit, the outside requeues (single_node.sbatch and multi_node.sbatch) and the scancel
run concurrently: Slurm queues whatever does not fit on the node. The preemption runs alone
afterwards: its urgent job takes the whole node, so it would preempt any other job of partition
debug that is running."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from local_slurm import LocalSlurm
from slurm_jobs import MULTI_NODE, SINGLE_NODE, Outcome, SubmittedJob, submit, survivors

FIRST_CHECKPOINT = "cycle: checkpoint 0 committed"
SHORT_RUN_DELAY = 0.05  # 256 steps: ~13 s of training
LONG_RUN_DELAY = 0.2  # ~51 s: still training when the time-limit notice comes
NOTICE = 15  # --signal=B:TERM@15 with --time=1: Slurm sends it 15..45 s before the limit
CONCURRENT = ("time_limit", "requeue", "scancel", "multi_node", "saver_only")
SUBMIT_STAGGER = 0.5
STAYS_CANCELLED_FOR = 20.0  # longer than cred_expire + sched_interval: a requeue would show


class Scenarios:
    """Runs the scenarios against one cluster, each in ``base/<name>``."""

    CONCURRENT = CONCURRENT
    TIME_LIMIT = ("--time=1", f"--signal=B:TERM@{NOTICE}")
    LONG_RUN_DELAY = LONG_RUN_DELAY

    def __init__(self, cluster: LocalSlurm, base: Path, environment: Path) -> None:
        self.cluster = cluster
        self.base = base
        self.environment = environment

    def run_all(self, names: set[str]) -> dict[str, Outcome | str]:
        """Each named scenario's outcome, or the traceback that ended it."""
        # Longest first: Slurm starts jobs in submission order, and the others fit around it.
        concurrent = [name for name in self.CONCURRENT if name in names]
        results: dict[str, Outcome | str] = {}
        if concurrent:
            with ThreadPoolExecutor(len(concurrent)) as pool:
                futures = {}
                for name in concurrent:
                    futures[name] = pool.submit(_captured, getattr(self, name))
                    time.sleep(SUBMIT_STAGGER)
                results = {name: future.result() for name, future in futures.items()}
        if "preemption" in names:
            results["preemption"] = _captured(self.preemption)
        return results

    def _submit(self, name: str, *sbatch_args: str, delay: float = SHORT_RUN_DELAY,
                template: Path = SINGLE_NODE, saver_only: bool = False) -> SubmittedJob:
        return submit(self.cluster, self.base / name, self.environment, "--job-name", name,
                      *sbatch_args, step_delay=delay, template=template, saver_only=saver_only)

    def requeue(self) -> Outcome:
        """``scontrol requeue`` from outside while the job trains."""
        return self._requeued(self._submit("requeue"))

    def saver_only(self) -> Outcome:
        """The same with a script that commits through the savers only (no StepControl)."""
        return self._requeued(self._submit("saver_only", delay=0.04, saver_only=True))

    def multi_node(self) -> Outcome:
        """The same with ``multi_node.sbatch`` on one node: ``cycle run`` in an srun step."""
        return self._requeued(self._submit("multi_node", "--nodes=1", template=MULTI_NODE))

    def _requeued(self, job: SubmittedJob) -> Outcome:
        job.wait_for_log(FIRST_CHECKPOINT)
        self.cluster.run(["scontrol", "requeue", job.id], check=True)
        job.wait_for_restarts(1)
        between = survivors(job.directory)
        job.wait_until_finished()
        return job.outcome(between + survivors(job.directory))

    def preemption(self) -> Outcome:
        """A job of the ``urgent`` partition that needs the whole node arrives."""
        job = self._submit("preemption")
        job.wait_for_log(FIRST_CHECKPOINT)
        urgent = self.cluster.run(
            [*self._urgent_job(), f"--output={job.directory / 'urgent.out'}", "--wrap", "sleep 2"],
            check=True, cwd=job.directory).strip()
        job.wait_for_restarts(1)
        between = survivors(job.directory)
        job.wait_until_finished()
        return job.outcome(between + survivors(job.directory),
                           urgent=self.cluster.job(urgent))

    def _urgent_job(self) -> list[str]:
        return ["sbatch", "--parsable", "--partition=urgent", "--exclusive", "--job-name=urgent"]

    def time_limit(self) -> Outcome:
        """``--time=1 --signal=B:TERM@15``: cycle stops at the notice and requeues the job.

        The requeued job gets ten minutes, so that its rerun trains to the end instead of
        hearing another notice (the first run shows the notice and the self-requeue)."""
        job = self._submit("time_limit", *self.TIME_LIMIT, delay=self.LONG_RUN_DELAY)
        fields = job.wait_for_restarts(1)
        between = survivors(job.directory)
        self.cluster.run(["scontrol", "update", f"JobId={job.id}", "TimeLimit=10"], check=True)
        job.wait_until_finished()
        return job.outcome(between + survivors(job.directory), requeued=fields)

    def scancel(self) -> Outcome:
        """``scancel``: the job stops at a checkpoint and stays cancelled; a new job submitted
        from the same directory finishes the training."""
        job = self._submit("scancel")
        job.wait_for_log(FIRST_CHECKPOINT)
        self.cluster.run(["scancel", job.id], check=True)
        cancelled_at = time.monotonic()
        job.wait_until_finished()
        left = survivors(job.directory)
        rerun = self._submit("scancel")
        rerun.wait_until_finished()
        left += survivors(job.directory)
        time.sleep(max(0.0, cancelled_at + STAYS_CANCELLED_FOR - time.monotonic()))
        outcome = job.outcome(left, rerun=rerun.fields(), later=self.cluster.job(job.id))
        outcome.log += rerun.log()
        return outcome


class AcrossHosts(Scenarios):
    """The same stops of a ``multi_node.sbatch`` job with ``--nodes=N`` on N hosts (every
    host of the cluster): the outside requeue and the time limit run together (each takes one
    CPU of each host), the preemption alone afterwards (its urgent job takes every host
    whole)."""

    CONCURRENT = ("time_limit", "requeue")

    def __init__(self, cluster: LocalSlurm, base: Path, environment: Path,
                 nnodes: int = 2) -> None:
        super().__init__(cluster, base, environment)
        self.nnodes = nnodes

    def _submit(self, name: str, *sbatch_args: str, delay: float = SHORT_RUN_DELAY,
                template: Path = MULTI_NODE, saver_only: bool = False) -> SubmittedJob:
        return super()._submit(name, f"--nodes={self.nnodes}", *sbatch_args, delay=delay,
                               template=MULTI_NODE)

    def _urgent_job(self) -> list[str]:
        return [*super()._urgent_job(), f"--nodes={self.nnodes}"]

    # Without "B:", as multi_node.sbatch has it: every node's `cycle run` (the srun step's
    # tasks) hears the notice, 45..75 s after the start (two hosts start slowly: a notice
    # 15..45 s after it came before the workers had started, under load 5 on 2 cores). Its
    # training (128 steps a rank) lasts ~100 s, past the latest notice.
    TIME_LIMIT = ("--time=2", "--signal=TERM@45")
    LONG_RUN_DELAY = 0.8


def _captured(scenario: Callable[[], Outcome]) -> Outcome | str:
    try:
        return scenario()
    except Exception:  # reported by the scenario's own test, not by the others
        return traceback.format_exc()

