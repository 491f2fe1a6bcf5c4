"""Simulated hosts for a Slurm across nodes (two, or four for the slow case): tests/netns's
network namespaces on one bridge (one address each, one shared filesystem, one pid namespace),
each with an ``/etc/hosts`` of its own.

``ip netns exec NS`` bind-mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts`` for what it starts
(slurmd and so every job step on that host): the node names resolve to the hosts' addresses, as a
cluster's DNS does, and this machine's host name to the host's own address, so that torchrun and
gloo, which look up their own host name, advertise the address the other host can reach.

Each slurmd runs in its host's namespace with its own address (the same port on both: they are
different addresses), not as Slurm's "multiple slurmd" on one address with distinct ports:
Debian 12's slurmd 22.05.8 is built without ``--enable-multiple-slurmd``, and namespaces are
closer to real hosts (srun's I/O, torchrun's store and gloo go over the hosts' links). The
cluster uses proctrack/pgid, not cgroup: without multiple-slurmd the slurmds would put a job's
processes in one cgroup (``freezer/slurm/uid_0/job_N`` is not per node), so one node's cleanup
would signal the other's, and ``ip netns exec`` remounts ``/sys``, hiding the cgroup hierarchy.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from local_slurm import SlurmHost

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "netns"))
from hosts import simulated_hosts, unavailable  # noqa: E402

__all__ = ["node_list", "slurm_hosts", "unavailable"]


def node_list(count: int) -> str:
    """Slurm's compact name of the ``count`` hosts' nodes, as ``scontrol show job`` prints it."""
    return f"h[1-{count}]"


@contextlib.contextmanager
def slurm_hosts(count: int = 2) -> Iterator[list[SlurmHost]]:
    """``count`` hosts named h1, h2, ..., torn down (with their ``/etc/netns`` files)
    afterwards."""
    with simulated_hosts(count) as hosts:
        directories = [Path("/etc/netns") / host.namespace for host in hosts]
        try:
            named = [(host, f"h{index + 1}") for index, host in enumerate(hosts)]
            table = "".join(f"{host.address} {name}\n" for host, name in named)
            for host, directory in zip(hosts, directories, strict=True):
                directory.mkdir(parents=True, exist_ok=True)
                (directory / "hosts").write_text(
                    f"127.0.0.1 localhost\n{table}{host.address} {socket.gethostname()}\n")
            yield [SlurmHost(name, host.address, tuple(host.command()))
                   for host, name in named]
        finally:
            for directory in directories:
                shutil.rmtree(directory, ignore_errors=True)
