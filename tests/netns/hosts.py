"""Simulated hosts for real-process tests: network namespaces on one bridge.

Each host has its own loopback and one address (10.77.0.1, 10.77.0.2, ...), joined by a veth
pair to a bridge that lives in a namespace of its own (the switch), so this machine's own
network is never touched. The hosts share this machine's filesystem, as nodes share the
checkpoint directory, and its pid namespace, so the tests can signal and kill any process.
Needs root and iproute2.
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
    """Why namespace hosts cannot be made here, or ``None``."""
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
def simulated_hosts(count: int) -> Iterator[tuple[Host, ...]]:
    """``count`` hosts on one bridge, torn down afterwards (deleting a namespace deletes its
    end of each veth pair, and with it the other end)."""
    tag = os.getpid() % 100000
    switch = f"cyc{tag}sw"
    hosts = tuple(Host(f"cyc{tag}h{index}", f"10.77.0.{index + 1}", f"cy{tag}h{index}")
                  for index in range(count))
    made = []
    try:
        for namespace in (switch, *(host.namespace for host in hosts)):
            _ip("netns", "add", namespace)
            made.append(namespace)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for index, host in enumerate(hosts):
            port = f"cy{tag}p{index}"
            _ip("link", "add", host.interface, "netns", host.namespace, "type", "veth",
                "peer", "name", port, "netns", switch)
            _ip("-n", switch, "link", "set", port, "master", "br0")
            _ip("-n", switch, "link", "set", port, "up")
            inside = ("-n", host.namespace)
            _ip(*inside, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip(*inside, "link", "set", host.interface, "up")
            _ip(*inside, "link", "set", "lo", "up")
        yield hosts
    finally:
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def two_hosts() -> contextlib.AbstractContextManager[tuple[Host, ...]]:
    """Two hosts on one bridge."""
    return simulated_hosts(2)
