"""Two simulated hosts for real-process tests: network namespaces joined by a veth pair.

Each host has its own loopback and one address (10.77.0.1 and 10.77.0.2); they share this
machine's filesystem, as nodes share the checkpoint directory, and its pid namespace, so the
tests can signal and kill any process. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str
    interface: str

    def command(self, *arguments: str) -> list[str]:
        """``arguments`` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *arguments]


def unavailable() -> str | None:
    """Why two namespace hosts cannot be made here, or ``None``."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip command is not installed"
    probe = f"cycprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*arguments: str) -> None:
    subprocess.run(["ip", *arguments], check=True, capture_output=True)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Two hosts on one link, torn down afterwards."""
    tag = os.getpid() % 100000
    hosts = (Host(f"cyc{tag}a", "10.77.0.1", f"cy{tag}a"), Host(f"cyc{tag}b", "10.77.0.2",
                                                                 f"cy{tag}b"))
    try:
        for host in hosts:
            _ip("netns", "add", host.namespace)
        _ip("link", "add", hosts[0].interface, "type", "veth", "peer", "name", hosts[1].interface)
        for host in hosts:
            _ip("link", "set", host.interface, "netns", host.namespace)
            inside = ("-n", host.namespace)
            _ip(*inside, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip(*inside, "link", "set", host.interface, "up")
            _ip(*inside, "link", "set", "lo", "up")
        yield hosts
    finally:
        for host in hosts:
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
