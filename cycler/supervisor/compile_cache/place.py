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
the user's when missing; one that is not the user's (another user made it first, or ``$USER``
names another account) is warned of once and its headers are not carried: no other user can
make a job refuse to start.

The directory travels with the checkpoint root (:mod:`cycler.supervisor.compile_cache.archive`):
after a checkpoint is committed and when a run ends, node 0 packs it into
``<root>/.cycler/compile-cache.tar`` if it changed
(:mod:`cycler.supervisor.compile_cache.carrier`); a start that finds its directory empty (a fresh
node) unpacks it first, unless its key differs.
torch's portable artifacts (``torch.compiler.save_cache_artifacts``) were measured and not
used: on the CPU they hold the FX graphs but not the compiled kernels, so a fresh node still
compiled every kernel (docs/compile-cache.md). No torch is imported here.
"""

from __future__ import annotations

import atexit
import getpass
import hashlib
import logging
import os
import platform
import pwd
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from cycler._private import check_safe_parent, make_private, owner_name
from cycler.checkpoint.memory_roots import memory_root
from cycler.errors import CheckpointDirectoryError
from cycler.supervisor.compile_cache.archive import CacheKey, unpack
from cycler.supervisor.configuration.options import RunOptions

log = logging.getLogger("cycler.supervisor")

ENV_INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"
ENV_TRITON_CACHE = "TRITON_CACHE_DIR"
INDUCTOR_SUBDIR, TRITON_SUBDIR = "inductor", "triton"
_FIX = "remove it if it is yours, or set TMPDIR to a directory of your own"


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


_RUN_BASE: list[Path] = []
"""The private base of this ``cycle run`` alone, once the user's own was found unusable."""


def node_base() -> Path:
    """The user's base for compile caches on this node (in ``$TMPDIR``, else ``/tmp``), or
    this run's own (:func:`_use_a_base_of_this_run`) where another user took that name."""
    if _RUN_BASE:
        return _RUN_BASE[0]
    return Path(tempfile.gettempdir()) / f"cycler-{os.geteuid()}"


def _use_a_base_of_this_run(problem: str) -> None:
    """The user's base (or a directory under it) cannot be used: compile in a fresh private
    directory that no one could have made first, removed when ``cycle run`` exits; one
    warning."""
    base = Path(tempfile.mkdtemp(prefix=f"cycler-{os.geteuid()}-run-"))
    _RUN_BASE.append(base)
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    log.warning("%s; this run compiles into %s, removed when it ends (nothing compiled is kept "
                "on this node for the next run)", problem, base)


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
    return options.record.compile_cache_path


def prepare_compile_cache(options: RunOptions, environ: Mapping[str, str] | None = None,
                          key: CacheKey | None = None) -> Path | None:
    """Before the workers start: make this job's node cache (private; where a directory of
    another user or one open to others is in its place, a private directory of this run's
    own is used instead, with one warning), check torch's default directory (another user's
    is warned of, once, and its headers are not carried), and fill an empty node cache from
    the root's carried one when its key matches. The node cache, ``None`` when the user chose
    their own. Raises :class:`CheckpointDirectoryError` (exit 2) only for a ``$TMPDIR`` that
    others could swap."""
    environ = os.environ if environ is None else environ
    if uses_own_cache(environ):
        return None
    key = cache_key(options.script) if key is None else key
    directory = node_cache_dir(options, key)
    check_safe_parent(directory.parents[3], "the temporary directory", fix=_FIX)
    try:
        _make_node_cache(directory)
    except CheckpointDirectoryError as error:
        _use_a_base_of_this_run(str(error))
        directory = node_cache_dir(options, key)
        _make_node_cache(directory)
    headers, problem = own_headers_dir()
    if problem is not None:
        say_headers_not_carried(problem)
    if not any(directory.iterdir()):
        said = unpack(carried_path(options), directory, headers, key)
        if said:
            log.info("%s", said)
    return directory


def _make_node_cache(directory: Path) -> None:
    for level in (directory.parents[2], directory.parents[1], directory.parent):
        make_private(level, "the compile cache's directory", fix=_FIX)
    make_private(directory, "the compile cache", fix=_FIX)


def torch_default_dir() -> Path:
    """torch's own default cache directory (``<tmp>/torchinductor_<user>``), named as
    inductor names it (``getpass`` reads ``LOGNAME``/``USER``, which the workers inherit): the
    path torch will use, never trusted for it: :func:`own_headers_dir` checks it by uid."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def headers_dir() -> Path:
    """Where torch keeps its precompiled C++ headers."""
    return torch_default_dir() / "precompiled_headers"


def own_headers_dir() -> tuple[Path | None, str | None]:
    """torch's headers directory and ``None`` when it is the user's (its default directory
    made 0700 if missing); else ``None`` and what is wrong (a sentence): another user's, open
    to others, not a directory. Never raises: a header directory never stops a job."""
    path = torch_default_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        return None, f"torch's compile directory {path} cannot be made ({error.strerror})"
    for directory in (path, headers_dir()):
        try:
            problem = _not_owned(os.lstat(directory))
        except FileNotFoundError:
            break  # the headers directory: made private when one is carried in
        except OSError as error:
            problem = f"cannot be read ({error.strerror})"
        if problem is not None:
            return None, f"torch's compile directory {directory} {problem}"
    return headers_dir(), None


def _not_owned(status: os.stat_result) -> str | None:
    if not stat.S_ISDIR(status.st_mode):
        return "is not a directory"
    if status.st_uid != os.geteuid():
        return f"belongs to {owner_name(status.st_uid)}, not to you (uid {os.geteuid()})"
    if status.st_mode & 0o022:
        return f"has mode {stat.S_IMODE(status.st_mode):o}: other users may write to it"
    return None


def say_headers_not_carried(problem: str) -> None:
    """The one warning for a headers directory that is not the user's."""
    named = "" if torch_default_dir().name.endswith(f"_{_account_name()}") else (
        f" ($USER/$LOGNAME name {getpass.getuser()}, not your account {_account_name()})")
    log.warning("%s%s: the job runs without carrying torch's precompiled headers (torch may "
                "build its own or fail to where it compiles C++ wrappers); to carry them, "
                "run with USER and LOGNAME set to your account, or set TMPDIR to a directory "
                "of your own", problem, named)


def _account_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid_{os.geteuid()}"
