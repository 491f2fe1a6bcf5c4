"""A real Slurm for the session, started fresh for each process-tracking mode in turn
(proctrack/cgroup, proctrack/pgid, then proctrack/linuxproc for the tests that ask for it).

A test names its scenario (``@pytest.mark.scenario("requeue")``) and the modes it runs under
(``@pytest.mark.proctrack(...)``, default cgroup and pgid); each mode runs the scenarios of the
selected tests once, concurrently where they fit. The tests across hosts
(test_slurm_across_hosts.py) have a cluster of their own, one slurmd on each simulated host, for
as long as the tests of that number of hosts run (two; four for the slow case). The daemons
live under a private temporary directory and are stopped by their pid files when the mode is
done. Where Slurm cannot run (not root, packages
missing, no network namespaces, a daemon that does not start) every test is skipped with the one
reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from local_slurm import (
    LocalSlurm,
    SlurmHost,
    SlurmUnavailable,
    cgroup_v1_freezer_problem,
    missing_binaries,
)
from scenarios import AcrossHosts, Scenarios
from slurm_hosts import slurm_hosts
from slurm_hosts import unavailable as hosts_unavailable
from slurm_jobs import (
    EXAMPLE,
    REPO,
    SAVER_ONLY,
    SAVER_ONLY_ARGS,
    TRAIN_ARGS,
    Outcome,
    runs_of,
    write_environment,
)

KEEP = os.environ.get("CYCLER_SLURM_KEEP") == "1"  # keep the session's directory to debug
SUMMARY: list[str] = []


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "not root (the daemons run as root)"
    if missing := missing_binaries():
        return f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd " \
               "slurm-client munge)"
    return None


@pytest.fixture(scope="session")
def session_directory() -> Iterator[Path]:
    # Not pytest's tmp_path: munged wants every directory above its socket searchable by all.
    directory = Path(tempfile.mkdtemp(prefix="cycler-slurm-"))
    directory.chmod(0o755)
    yield directory
    if not KEEP:
        shutil.rmtree(directory, ignore_errors=True)


class ReferenceRun:
    """The same training run uninterrupted, outside Slurm, started in the background."""

    def __init__(self, directory: Path, script: list[str], ranks: int = 1) -> None:
        directory.mkdir()
        self.final = directory / "final.pt"
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("SLURM_", "CYCLER_"))}
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", str(ranks),
                   "--checkpoint-dir", str(directory / "checkpoints"), "--no-requeue",
                   *script, "--final-weights", str(self.final)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=env,
                                        cwd=directory)

    def weights(self) -> dict[str, torch.Tensor]:
        output, _ = self.process.communicate(timeout=300)
        assert self.process.returncode == 0, output
        return torch.load(self.final, weights_only=True)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def reference_run(session_directory: Path) -> Iterator[ReferenceRun]:
    run = ReferenceRun(session_directory / "uninterrupted", [str(EXAMPLE), *TRAIN_ARGS])
    yield run
    run.stop()


@pytest.fixture(scope="session")
def reference(reference_run: ReferenceRun) -> dict[str, torch.Tensor]:
    """Final weights of the same training run uninterrupted, outside Slurm."""
    return reference_run.weights()


@pytest.fixture(scope="session")
def saver_only_reference(session_directory: Path) -> dict[str, torch.Tensor]:
    """Final weights of the saver-only script's training uninterrupted, outside Slurm."""
    run = ReferenceRun(session_directory / "uninterrupted-saver-only",
                       [str(SAVER_ONLY), *SAVER_ONLY_ARGS])
    try:
        return run.weights()
    finally:
        run.stop()


@pytest.fixture(scope="module")
def nnodes(request: pytest.FixtureRequest) -> int:
    """How many hosts the across-hosts cluster has: the test's ``nnodes`` parameter (its
    module parametrizes every test with it, so that one cluster serves each count)."""
    return int(request.param)


@pytest.fixture(scope="module")
def reference_across_hosts(session_directory: Path, nnodes: int) -> Iterator[ReferenceRun]:
    """The training of an N-node job (one rank per node) uninterrupted, as N ranks on one
    machine outside Slurm (gloo sums the ranks' gradients alike wherever they run)."""
    run = ReferenceRun(session_directory / f"uninterrupted-{nnodes}-ranks",
                       [str(EXAMPLE), *TRAIN_ARGS], ranks=nnodes)
    yield run
    run.stop()


MODES = ("cgroup", "pgid", "linuxproc")
DEFAULT_MODES = ("cgroup", "pgid")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "scenario(name): the Slurm scenario a test judges")
    config.addinivalue_line("markers", "proctrack(*modes): the ProctrackTypes it runs under")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cluster" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("proctrack")
        modes = marker.args if marker is not None else DEFAULT_MODES
        # In MODES order, so that pytest starts each cluster once.
        metafunc.parametrize("cluster", [mode for mode in MODES if mode in modes],
                             indirect=True, scope="session")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, session_directory: Path) -> Iterator[LocalSlurm]:
    if (reason := unavailable()) is not None:
        pytest.skip(f"real Slurm unavailable: {reason}")
    proctrack: str = request.param
    if proctrack == "cgroup" and (problem := cgroup_v1_freezer_problem()) is not None:
        pytest.skip(f"proctrack/cgroup unavailable: {problem}")
    request.getfixturevalue("reference_run")  # trains while the cluster starts and runs
    slurm = LocalSlurm(session_directory / proctrack / "slurm", proctrack)
    try:
        slurm.start()
    except SlurmUnavailable as error:
        slurm.stop()
        pytest.skip(f"real Slurm unavailable: {error}")
    yield slurm
    slurm.stop()


@pytest.fixture(scope="module")
def hosts(nnodes: int) -> Iterator[list[SlurmHost]]:
    """``nnodes`` simulated hosts, h1, h2, ... (network namespaces); skipped with the reason
    where they cannot be made."""
    if (reason := hosts_unavailable()) is not None:
        pytest.skip(f"simulated hosts unavailable: {reason}")
    with slurm_hosts(nnodes) as made:
        yield made


@pytest.fixture(scope="module")
def cluster_across_hosts(request: pytest.FixtureRequest, session_directory: Path,
                         hosts: list[SlurmHost], nnodes: int) -> Iterator[LocalSlurm]:
    """One slurmd on each host, slurmctld on h1, proctrack/pgid (slurm_hosts.py says why not
    cgroup); torn down when the tests of this number of hosts are done."""
    if (reason := unavailable()) is not None:
        pytest.skip(f"real Slurm unavailable: {reason}")
    request.getfixturevalue("reference_across_hosts")  # trains while the cluster starts
    slurm = LocalSlurm(session_directory / f"hosts-{nnodes}" / "slurm", "pgid", hosts)
    try:
        slurm.start()
    except SlurmUnavailable as error:
        slurm.stop()
        pytest.skip(f"real Slurm across hosts unavailable: {error}")
    yield slurm
    slurm.stop()


@pytest.fixture(scope="module")
def outcomes_across_hosts(request: pytest.FixtureRequest, cluster_across_hosts: LocalSlurm,
                          session_directory: Path, nnodes: int) -> dict[str, Outcome | str]:
    """The scenarios on ``nnodes`` hosts that the selected tests judge, each run once."""
    base = session_directory / f"hosts-{nnodes}"
    environment = write_environment(base / "venv")
    wanted = {item.get_closest_marker("scenario").args[0] for item in request.session.items
              if "outcome_across_hosts" in getattr(item, "fixturenames", ())
              and getattr(item, "callspec", None) is not None
              and item.callspec.params.get("nnodes") == nnodes}
    results = AcrossHosts(cluster_across_hosts, base, environment, nnodes).run_all(wanted)
    SUMMARY.extend(summary_lines(f"pgid, {nnodes} hosts", results))
    return results


@pytest.fixture
def outcome_across_hosts(request: pytest.FixtureRequest,
                         outcomes_across_hosts: dict[str, Outcome | str]) -> Outcome:
    """What the two-host scenario named by the test's ``scenario`` marker left behind."""
    return _scenario_outcome(request, outcomes_across_hosts)


@pytest.fixture(scope="session")
def outcomes(request: pytest.FixtureRequest, cluster: LocalSlurm,
             session_directory: Path) -> dict[str, Outcome | str]:
    """The scenarios that this mode's selected tests judge, each run once against it."""
    base = session_directory / cluster.proctrack
    environment = write_environment(base / "venv")
    results = Scenarios(cluster, base, environment).run_all(
        scenarios_wanted(request.session.items, cluster.proctrack))
    SUMMARY.extend(summary_lines(cluster.proctrack, results))
    return results


def scenarios_wanted(items: list[pytest.Item], proctrack: str) -> set[str]:
    wanted = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        marker = item.get_closest_marker("scenario")
        if callspec is not None and callspec.params.get("cluster") == proctrack and marker:
            wanted.add(marker.args[0])
    return wanted


@pytest.fixture
def outcome(request: pytest.FixtureRequest, outcomes: dict[str, Outcome | str]) -> Outcome:
    """What the scenario named by the test's ``scenario`` marker left behind."""
    return _scenario_outcome(request, outcomes)


def _scenario_outcome(request: pytest.FixtureRequest,
                      outcomes: dict[str, Outcome | str]) -> Outcome:
    name = request.node.get_closest_marker("scenario").args[0]
    result = outcomes[name]
    if isinstance(result, str):
        pytest.fail(f"the {name} scenario did not finish:\n{result}", pytrace=False)
    return result


def summary_lines(proctrack: str, results: dict[str, Outcome | str]) -> list[str]:
    lines = []
    for name, outcome in results.items():
        if isinstance(outcome, str):
            lines.append(f"proctrack/{proctrack} {name}: failed")
            continue
        runs = ", ".join(
            f"exit {run.code}" + ("" if run.signal_at is None else
                                  f" (commit {_seconds(run.commit_after_signal)}, exit "
                                  f"{_seconds(run.exit_after_signal)} after the signal)")
            for run in outcome.runs())
        lines.append(f"proctrack/{proctrack} {name}: {outcome.seconds:.0f} s, "
                     f"Restarts={outcome.fields.get('Restarts')}, runs: {runs}; "
                     f"rerun after {_seconds(rerun_delay(outcome))}")
        if outcome.fields.get("NumNodes", "1") != "1":
            exits = "; ".join(f"node {node} exits {[run.code for run in runs_of(events)]}"
                              for node, events in enumerate(outcome.every_node_events()))
            lines.append(f"    on {outcome.fields.get('NodeList')}: {exits}")
    return lines


def rerun_delay(outcome: Outcome) -> float | None:
    """From the first run's exit to the next run's start."""
    runs = outcome.runs()
    if len(runs) < 2 or runs[0].ended_at is None or runs[1].started_at is None:
        return None
    return runs[1].started_at - runs[0].ended_at


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("Slurm scenarios")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def weights_across_hosts(reference_across_hosts: ReferenceRun) -> dict[str, torch.Tensor]:
    """Final weights of the N-node job's training uninterrupted, outside Slurm."""
    return reference_across_hosts.weights()
