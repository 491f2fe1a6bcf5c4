"""Two simulated hosts for a Slurm across nodes: tests/netns's network namespaces (one address
each, one shared filesystem, one pid namespace), each with an ``/etc/hosts`` of its own.

``ip netns exec NS`` bind-mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts`` for what it starts
(slurmd and so every job step on that host): the node names resolve to the hosts' addresses, as a
cluster's DNS does, and this machine's host name to the host's own address, so that torchrun and
gloo, which look up their own host name, advertise the address the other host can reach.

Each slurmd runs in its host's namespace with its own address (the same port on both: they are
different addresses), not as Slurm's "multiple slurmd" on one address with distinct ports:
Debian 12's slurmd 22.05.8 is built without ``--enable-multiple-slurmd``, and namespaces are
closer to real hosts (srun's I/O, torchrun's store and gloo go over the hosts' link). The
cluster uses proctrack/pgid, not cgroup: without multiple-slurmd the two slurmds would put a job's
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
from hosts import two_hosts, unavailable  # noqa: E402

NAMES = ("h1", "h2")

__all__ = ["NAMES", "slurm_hosts", "unavailable"]


@contextlib.contextmanager
def slurm_hosts() -> Iterator[list[SlurmHost]]:
    """Two hosts named h1 and h2, torn down (with their ``/etc/netns`` files) afterwards."""
    with two_hosts() as hosts:
        directories = [Path("/etc/netns") / host.namespace for host in hosts]
        try:
            named = list(zip(hosts, NAMES, strict=True))
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
