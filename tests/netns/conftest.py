"""The two-host suite runs only where network namespaces can be made (root, iproute2)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hosts import Host, two_hosts, unavailable  # noqa: E402

pytestmark = pytest.mark.netns


@pytest.fixture(scope="session")
def hosts() -> Iterator[tuple[Host, Host]]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"simulated hosts unavailable: {reason}")
    with two_hosts() as made:
        yield made
