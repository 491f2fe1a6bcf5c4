"""The compile cache carried in a checkpoint root: packed under a key, unpacked only under the
same key, and never trusted more than a checkpoint (real files, no process)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from cycler.checkpoint.listing import list_checkpoints
from cycler.supervisor.compile_cache.archive import CACHE, HEADERS, pack, unpack
from cycler.supervisor.compile_cache.place import cache_key


def node_cache(tmp_path: Path) -> dict[str, Path]:
    cache, headers = tmp_path / "node" / "cache", tmp_path / "node" / "headers"
    (cache / "fxgraph" / "ab").mkdir(parents=True)
    (cache / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    (cache / "k1").mkdir()
    (cache / "k1" / "kernel.so").write_bytes(b"\x7fELF kernel")
    (cache / "locks").mkdir()
    (cache / "locks" / "k1.lock").write_bytes(b"")
    headers.mkdir()
    (headers / "h1.h.gch").write_bytes(b"precompiled")
    (headers / "locks").mkdir()
    (headers / "locks" / "h1.lock").write_bytes(b"")
    return {CACHE: cache, HEADERS: headers}


def fresh_node(tmp_path: Path) -> tuple[Path, Path]:
    cache, headers = tmp_path / "fresh" / "cache", tmp_path / "fresh" / "headers"
    cache.mkdir(parents=True, mode=0o700)
    return cache, headers


def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import torch\n")
    return path


def test_a_fresh_node_gets_the_carried_files_and_headers_but_no_locks(tmp_path: Path) -> None:
    key = cache_key(script(tmp_path))
    carried = tmp_path / "root" / ".cycler" / "compile-cache.tar"
    carried.parent.mkdir(parents=True)
    said = pack(node_cache(tmp_path), carried, key)
    assert said is not None and said.startswith("carried the compile cache (3 files")
    assert stat.S_IMODE(os.lstat(carried).st_mode) == 0o600
    cache, headers = fresh_node(tmp_path)
    said = unpack(carried, cache, headers, key)
    assert said is not None and said.startswith("loaded the carried compile cache (3 files)")
    assert (cache / "fxgraph" / "ab" / "entry").read_bytes() == b"graph"
    assert (cache / "k1" / "kernel.so").read_bytes() == b"\x7fELF kernel"
    assert not (cache / "locks").exists()
    assert (headers / "h1.h.gch").read_bytes() == b"precompiled"
    assert stat.S_IMODE(os.lstat(cache).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(cache / "k1" / "kernel.so").st_mode) == 0o600
    assert sorted(p.name for p in cache.parent.iterdir()) == ["cache", "headers"]


def test_a_cache_is_carried_again_only_when_it_changed(tmp_path: Path) -> None:
    key, sources = cache_key(script(tmp_path)), node_cache(tmp_path)
    carried = tmp_path / "compile-cache.tar"
    assert pack(sources, carried, key) is not None
    assert pack(sources, carried, key) is None
    newer = os.lstat(carried).st_mtime + 5
    (sources[CACHE] / "k2.so").write_bytes(b"new kernel")
    os.utime(sources[CACHE] / "k2.so", (newer, newer))
    said = pack(sources, carried, key)
    assert said is not None and "(4 files" in said


def test_a_cache_made_under_another_torch_is_not_loaded(tmp_path: Path) -> None:
    carried = tmp_path / "compile-cache.tar"
    made = cache_key(script(tmp_path), torch_version="2.12.0+fake")
    pack(node_cache(tmp_path), carried, made)
    cache, headers = fresh_node(tmp_path)
    said = unpack(carried, cache, headers, cache_key(script(tmp_path), torch_version="2.13.0"))
    assert said == (f"the carried compile cache {carried} is not loaded: it was made for torch "
                    "2.12.0+fake, this run has 2.13.0")
    assert list(cache.iterdir()) == [] and not headers.exists()


def test_a_cache_made_for_an_edited_script_is_not_loaded(tmp_path: Path) -> None:
    carried, path = tmp_path / "compile-cache.tar", script(tmp_path)
    pack(node_cache(tmp_path), carried, cache_key(path))
    path.write_text("import torch  # edited\n")
    cache, headers = fresh_node(tmp_path)
    said = unpack(carried, cache, headers, cache_key(path))
    assert said is not None and "is not loaded: it was made for script " in said
    assert list(cache.iterdir()) == []


def test_a_truncated_or_garbage_carried_cache_is_ignored_with_one_line(tmp_path: Path) -> None:
    key, carried = cache_key(script(tmp_path)), tmp_path / "compile-cache.tar"
    pack(node_cache(tmp_path), carried, key)
    whole = carried.read_bytes()
    for content in (whole[: len(whole) // 2], b"", b"not a tar at all" * 100):
        carried.write_bytes(content)
        cache, headers = fresh_node(tmp_path)
        said = unpack(carried, cache, headers, key)
        assert said is not None and said.startswith(
            f"the carried compile cache {carried} is not loaded:") and "\n" not in said
        assert list(cache.iterdir()) == [] and stat.S_IMODE(os.lstat(cache).st_mode) == 0o700
        assert sorted(p.name for p in cache.parent.iterdir()) == ["cache"]
        cache.rmdir()


def hostile_tar(carried: Path, key_record: bytes, member: tarfile.TarInfo) -> None:
    with tarfile.open(carried, "w") as archive:
        info = tarfile.TarInfo("key.json")
        info.size = len(key_record)
        archive.addfile(info, io.BytesIO(key_record))
        archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)


def test_a_carried_cache_that_names_a_path_outside_or_a_link_is_not_loaded(
        tmp_path: Path) -> None:
    key, carried = cache_key(script(tmp_path)), tmp_path / "good.tar"
    pack(node_cache(tmp_path), carried, key)
    with tarfile.open(carried) as archive:
        record = archive.extractfile("key.json").read()  # type: ignore[union-attr]
    escape = tarfile.TarInfo("cache/../../escaped")
    escape.size = 1
    link = tarfile.TarInfo("cache/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    nested_header = tarfile.TarInfo("headers/sub/h.gch")
    nested_header.size = 1
    for member in (escape, link, nested_header):
        hostile = tmp_path / "hostile.tar"
        hostile_tar(hostile, record, member)
        cache, headers = fresh_node(tmp_path)
        said = unpack(hostile, cache, headers, key)
        assert said is not None and "which is not a file of the cache" in said
        assert list(cache.iterdir()) == [] and not (tmp_path / "escaped").exists()
        assert not (tmp_path / "fresh" / "escaped").exists()
        cache.rmdir()


def test_the_carried_cache_is_never_taken_for_a_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "root"
    carried = root / ".cycler" / "compile-cache.tar"
    carried.parent.mkdir(parents=True)
    pack(node_cache(tmp_path), carried, cache_key(script(tmp_path)))
    assert list_checkpoints(root) == []


def test_a_cache_larger_than_the_bound_is_not_carried(tmp_path: Path) -> None:
    carried = tmp_path / "compile-cache.tar"
    said = pack(node_cache(tmp_path), carried, cache_key(script(tmp_path)), limit=10)
    assert said is not None and "is larger than" in said and not carried.exists()


def test_a_carry_removes_what_a_killed_carry_left_behind(tmp_path: Path) -> None:
    from cycler import _fs

    carried = tmp_path / "compile-cache.tar"
    mine = _fs.temporary_sibling(carried).name
    dead = tmp_path / mine.replace(f"-{os.getpid()}-", "-999999999-")
    dead.write_bytes(b"half a tar")
    pack(node_cache(tmp_path), carried, cache_key(script(tmp_path)))
    assert not dead.exists() and carried.exists()


def test_a_carried_file_that_is_not_a_plain_file_of_the_user_is_not_loaded(
        tmp_path: Path) -> None:
    key, carried = cache_key(script(tmp_path)), tmp_path / "compile-cache.tar"
    pack(node_cache(tmp_path), carried, key)
    cases = [("fifo", "it is not a regular file"), ("link", "unreadable")]
    if os.geteuid() == 0:
        cases.append(("chown", "it belongs to uid 65534, not to you"))
    for kind, why in cases:
        planted = tmp_path / f"planted-{kind}.tar"
        if kind == "fifo":
            os.mkfifo(planted, 0o600)  # opened without waiting for a writer
        elif kind == "link":
            planted.symlink_to(carried)
        else:
            planted.write_bytes(carried.read_bytes())
            os.chown(planted, 65534, 65534)
        cache, headers = fresh_node(tmp_path)
        said = unpack(planted, cache, headers, key)
        assert said is not None and said.startswith(
            f"the carried compile cache {planted} is not loaded: ") and why in said, said
        assert list(cache.iterdir()) == []
        cache.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="planting as another user needs root (chown)")
def test_a_carried_file_of_another_user_is_replaced_by_the_next_carry(tmp_path: Path) -> None:
    key, carried, sources = cache_key(script(tmp_path)), tmp_path / "c.tar", node_cache(tmp_path)
    pack(sources, carried, key)
    os.chown(carried, 65534, 65534)
    said = pack(sources, carried, key)
    assert said is not None and said.startswith("carried the compile cache")
    assert os.lstat(carried).st_uid == os.geteuid()
