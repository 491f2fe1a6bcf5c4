"""Manifest checksums: XXH3 for new checkpoints, CRC-32 (joined from parallel parts) for
version-1 manifests, which are still read and verified."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from cycler.checkpoint.checksum import CRC32, XXH3, crc32_combine, file_checksum, file_crc32
from cycler.checkpoint.manifest import MANIFEST_NAME, check_files, read_manifest, seal


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


def test_xxh3_of_a_file_read_in_chunks_is_that_of_its_bytes(tmp_path: Path) -> None:
    data = os.urandom(9 * 1024 * 1024 + 7)  # two full 4 MB reads and a short one
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_checksum(path) == xxhash.xxh3_64_hexdigest(data)
    assert file_checksum(path, CRC32) == f"{zlib.crc32(data):08x}"
    with pytest.raises(ValueError, match="unknown checksum 'md5'"):
        file_checksum(path, "md5")


def _flip_one_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_new_manifest_records_xxh3_and_catches_a_same_size_bit_flip(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(os.urandom(100_000))
    seal(tmp_path, index=0)
    stored = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert (stored["version"], stored["checksum"]) == (2, XXH3)
    manifest = read_manifest(tmp_path)
    assert check_files(tmp_path, manifest, checksums=True) is None
    _flip_one_bit(tmp_path / "model.pt")
    assert check_files(tmp_path, manifest) is None  # sizes alone cannot see it
    assert check_files(tmp_path, manifest, checksums=True) == "model.pt does not match its checksum"


def test_a_version_1_manifest_is_still_verified_with_crc32(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    (tmp_path / "model.pt").write_bytes(data)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({
        "format": "cycler.checkpoint", "version": 1, "index": 3, "created_at": 0.0,
        "world_size": 1, "step": 7, "epoch": None, "cycler_version": "0.1.0", "metadata": {},
        "files": {"model.pt": {"size": len(data), "crc32": f"{zlib.crc32(data):08x}"}},
    }))
    manifest = read_manifest(tmp_path)
    assert (manifest.checksum, manifest.step) == (CRC32, 7)
    assert check_files(tmp_path, manifest, checksums=True) is None
    _flip_one_bit(tmp_path / "model.pt")
    assert check_files(tmp_path, manifest, checksums=True) == "model.pt does not match its checksum"


def test_a_manifest_from_a_newer_cycler_is_refused_with_its_version(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"x")
    seal(tmp_path, index=0)
    stored = json.loads((tmp_path / MANIFEST_NAME).read_text())
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**stored, "version": 3}))
    with pytest.raises(Exception, match="manifest version 3 is not one this cycler reads"):
        read_manifest(tmp_path)
