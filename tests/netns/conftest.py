"""The simulated-hosts suite runs only where network namespaces can be made (root, iproute2):
four hosts on one bridge, made once; the two-host tests run on the first two."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hosts import Host, simulated_hosts, unavailable  # noqa: E402

pytestmark = pytest.mark.netns


@pytest.fixture(scope="session")
def four_hosts() -> Iterator[tuple[Host, ...]]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"simulated hosts unavailable: {reason}")
    with simulated_hosts(4) as made:
        yield made


@pytest.fixture(scope="session")
def hosts(four_hosts: tuple[Host, ...]) -> tuple[Host, ...]:
    return four_hosts[:2]
