"""torch.compile's caches under ``cycle run``: a private place on the node, carried with the root.

torch keeps what ``torch.compile`` built (inductor's FX graphs and AOT autograd entries, the
compiled C++ or triton kernels) in ``$TORCHINDUCTOR_CACHE_DIR`` and ``$TRITON_CACHE_DIR``, by
default under ``/tmp/torchinductor_<user>``: a name any local user can create first and fill
with a shared object that the job would then load, and a place a requeue to another node
leaves behind. Unless the user set ``TORCHINDUCTOR_CACHE_DIR`` themselves, ``cycle run``
points both at a directory of this job on this node (:func:`node_cache_dir`, private to the
user like the memory tier), keyed by :class:`CacheKey`: another torch, Python, CPU or GPU
model, or an edited script gets a directory of its own, never a stale cache. torch's own
default directory, where it keeps precompiled headers whatever these variables say, is made
(or checked to be) the user's, not writable by others.

The directory travels with the checkpoint root (:mod:`cycler.supervisor.carried_cache`):
after a checkpoint is committed and when a run ends, node 0 packs it into
``<root>/.cycler/compile-cache.tar`` if it changed (:mod:`cycler.supervisor.cache_carrier`); a
start that finds its directory empty (a fresh node) unpacks it first, unless its key differs.
torch's portable artifacts (``torch.compiler.save_cache_artifacts``) were measured and not
used: on the CPU they hold the FX graphs but not the compiled kernels, so a fresh node still
compiled every kernel (docs/compile-cache.md). No torch is imported here.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import logging
import os
import platform
import re
import stat
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cycler.checkpoint.memory_roots import memory_root
from cycler.checkpoint.private_dirs import check_safe_parent, make_private
from cycler.errors import CheckpointDirectoryError
from cycler.protocol.names import COMPILE_CACHE_FILENAME
from cycler.supervisor.options import RunOptions

log = logging.getLogger("cycler.supervisor")

ENV_INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"
ENV_TRITON_CACHE = "TRITON_CACHE_DIR"
INDUCTOR_SUBDIR, TRITON_SUBDIR = "inductor", "triton"
_FIX = "remove it if it is yours, or set TMPDIR to a directory of your own"


@dataclass(frozen=True)
class CacheKey:
    """What a compile cache is only valid for: a cache made under another key is never used."""

    torch: str
    """torch's version with its build (``2.13.0+cpu``)."""
    python: str
    device: str
    """The machine, CPU model and GPU models (kernels are built for them)."""
    script: str
    """sha256 of the training script (of its name, for a module)."""

    def digest(self) -> str:
        """A short name for this key (the node directory's)."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def difference(self, other: Mapping[str, object]) -> str | None:
        """How ``other`` (a key as a mapping) differs from this one, ``None`` if it does not."""
        for name, mine in dataclasses.asdict(self).items():
            theirs = other.get(name)
            if theirs != mine:
                return f"it was made for {name} {_short(theirs)}, this run has {_short(mine)}"
        return None


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:12] + "..."


def cache_key(script: str | os.PathLike[str], torch_version: str | None = None) -> CacheKey:
    """This node's key for ``script`` (``torch_version``: the installed torch's, read from its
    package metadata without importing it)."""
    version = torch_version if torch_version is not None else installed_torch_version()
    python = ".".join(map(str, sys.version_info[:3]))
    return CacheKey(torch=version, python=python, device=device_description(),
                    script=script_digest(script))


def installed_torch_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "unknown"


def device_description() -> str:
    """The machine, its CPU's model name and ISA flags' hash, and its NVIDIA GPUs' models."""
    cpu, flags = "", ""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    if match := re.search(r"^model name\s*:\s*(.*)$", text, re.MULTILINE):
        cpu = match.group(1).strip()
    if match := re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE):
        flags = hashlib.sha256(match.group(1).encode()).hexdigest()[:8]
    return " / ".join(filter(None, [platform.machine(), cpu, flags, *_gpu_models()]))


def _gpu_models() -> list[str]:
    models = []
    for information in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            text = information.read_text(errors="replace")
        except OSError:
            continue
        if match := re.search(r"^Model:\s*(.*)$", text, re.MULTILINE):
            models.append(match.group(1).strip())
    return models


def script_digest(script: str | os.PathLike[str]) -> str:
    """sha256 of the script's bytes; of its name when it cannot be read (``-m module``)."""
    try:
        data = Path(script).read_bytes()
    except OSError:
        data = os.fsencode(script)
    return hashlib.sha256(data).hexdigest()


def uses_own_cache(environ: Mapping[str, str]) -> bool:
    """Whether the user chose torch's cache directory: ``cycle run`` then leaves it alone."""
    return bool(environ.get(ENV_INDUCTOR_CACHE))


def node_base() -> Path:
    """The user's base for compile caches on this node (in ``$TMPDIR``, else ``/tmp``)."""
    return Path(tempfile.gettempdir()) / f"cycler-{os.geteuid()}"


def node_cache_dir(options: RunOptions, key: CacheKey | None = None) -> Path:
    """This job's compile cache on this node, for ``key`` (default: :func:`cache_key`)."""
    key = cache_key(options.script) if key is None else key
    job = memory_root(node_base() / "compile", options.layout.root)
    return job / key.digest()


def compile_cache_environment(options: RunOptions, environ: Mapping[str, str],
                              ) -> dict[str, str]:
    """The variables that point the workers' torch at this job's node cache (none when the
    user set ``TORCHINDUCTOR_CACHE_DIR``; ``TRITON_CACHE_DIR`` only when unset)."""
    if uses_own_cache(environ):
        return {}
    directory = node_cache_dir(options)
    environment = {ENV_INDUCTOR_CACHE: str(directory / INDUCTOR_SUBDIR)}
    if not environ.get(ENV_TRITON_CACHE):
        environment[ENV_TRITON_CACHE] = str(directory / TRITON_SUBDIR)
    return environment


def carried_path(options: RunOptions) -> Path:
    """Where the root carries the job's compile cache."""
    return options.layout.supervisor_dir / COMPILE_CACHE_FILENAME


def prepare_compile_cache(options: RunOptions, environ: Mapping[str, str] | None = None,
                          key: CacheKey | None = None) -> Path | None:
    """Before the workers start: make this job's node cache (private; a directory of another
    user or open to others in its place is refused with :class:`CheckpointDirectoryError`,
    exit 2), check torch's default directory, and fill an empty node cache from the root's
    carried one when its key matches. The node cache, ``None`` when the user chose their own."""
    from cycler.supervisor.carried_cache import unpack

    environ = os.environ if environ is None else environ
    if uses_own_cache(environ):
        return None
    key = cache_key(options.script) if key is None else key
    directory = node_cache_dir(options, key)
    check_safe_parent(directory.parents[3], "the temporary directory", fix=_FIX)
    for level in (directory.parents[2], directory.parents[1], directory.parent):
        make_private(level, "the compile cache's directory", fix=_FIX)
    make_private(directory, "the compile cache", fix=_FIX)
    check_torch_default_dir()
    if not any(directory.iterdir()):
        said = unpack(carried_path(options), directory, headers_dir(), key)
        if said:
            log.info("%s", said)
    return directory


def torch_default_dir() -> Path:
    """torch's own default cache directory (``<tmp>/torchinductor_<user>``), named as
    inductor names it (``getpass`` reads ``LOGNAME``/``USER``, which the workers inherit)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def headers_dir() -> Path:
    """Where torch keeps its precompiled C++ headers."""
    return torch_default_dir() / "precompiled_headers"


def check_torch_default_dir() -> None:
    """torch keeps precompiled C++ headers in its default directory whatever
    ``TORCHINDUCTOR_CACHE_DIR`` says: create it 0700, or refuse one (or a headers directory in
    it) that another user owns or may write to (a planted header would be compiled into the
    job's kernels)."""
    path = torch_default_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise CheckpointDirectoryError(
            f"cannot create torch's compile cache directory {path} ({error.strerror})") from None
    _check_owned(path)
    if os.path.lexists(headers_dir()):
        _check_owned(headers_dir())


def _check_owned(path: Path) -> None:
    status = os.lstat(path)
    problem = None
    if not stat.S_ISDIR(status.st_mode):
        problem = "is not a directory"
    elif status.st_uid != os.geteuid():
        problem = f"belongs to uid {status.st_uid}, not to you (uid {os.geteuid()})"
    elif status.st_mode & 0o022:
        problem = f"has mode {stat.S_IMODE(status.st_mode):o}: other users may write to it"
    if problem is not None:
        raise CheckpointDirectoryError(
            f"torch's compile cache directory {path} {problem}: refusing to start workers "
            f"that would compile from it; {_FIX}")
