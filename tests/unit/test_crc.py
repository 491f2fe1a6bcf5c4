"""CRC-32 of a file in parallel parts equals zlib's CRC-32 of the whole."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cycler.checkpoint.crc import crc32_combine, file_crc32


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_combining_two_crcs_gives_the_crc_of_the_concatenation(first: bytes, second: bytes):
    joined = crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second))
    assert joined == zlib.crc32(first + second)


def test_a_file_in_many_parts_has_the_crc_of_the_whole(tmp_path: Path) -> None:
    data = os.urandom(5 * 1024 * 1024 + 123)
    path = tmp_path / "blob"
    path.write_bytes(data)
    # Six parts, the last one short.
    assert file_crc32(path, part=1024 * 1024) == f"{zlib.crc32(data):08x}"
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert file_crc32(empty) == f"{zlib.crc32(b''):08x}"
