"""What ``cycle run`` checks and settles before it starts anything (errors exit 2).

The script must be startable in the way torchrun will start it and node 0's port free
(:mod:`.launch.startable`), the checkpoint root and the lossy directory writable, and
``--resume-from`` either carried out already by this job (then it is dropped) or naming a
checkpoint that exists.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from cycler._fs import atomic_write_bytes, caused_by_full_disk, read_json_object
from cycler._private import (
    PRIVATE_FILE_MODE,
    Trust,
    check_owned_directory,
    check_owned_place,
    check_safe_parent,
    make_owned_directory,
    make_parents_private,
    user_trust,
)
from cycler.checkpoint.listing import find_checkpoint, no_valid_checkpoint
from cycler.checkpoint.memory_roots import (
    is_private,
    prepare_memory_root,
    prepare_runtime_dir,
    sweep_stale_roots,
)
from cycler.checkpoint.tiers import overflowed
from cycler.errors import CheckpointDirectoryError, ConfigError, CyclerError
from cycler.protocol.environment import ENV_ISC_ARTIFACT_PATH, ENV_ISC_LOSSY_PATH
from cycler.protocol.record import RunRecord
from cycler.supervisor.compile_cache.place import prepare_compile_cache
from cycler.supervisor.configuration.options import RunOptions
from cycler.supervisor.launch.startable import check_port_free, check_python_script
from cycler.supervisor.launch.torchrun import isc_environment, store_port

log = logging.getLogger("cycler.supervisor")


def checked_options(options: RunOptions, *, prepare_root: bool) -> RunOptions:
    """The pre-start sequence of ``cycle run``: the script, ``$CHECKPOINT_ARTIFACT_PATH``, the
    checkpoint root, the memory tier's root and the compile cache's node directory (created
    and probed when ``prepare_root``; ``--dry-run`` creates nothing), and ``--resume-from``;
    returns the options this run starts with (``--resume-from`` dropped when an earlier run of
    the job carried it out). Raises :class:`CyclerError` (exit 2)."""
    check_script(options)
    check_artifact_path(options)
    if prepare_root:
        port = store_port(options)
        if port is not None:
            check_port_free(port)
        prepare_checkpoint_root(options)
        prepare_memory_tier(options)
        prepare_runtime_dir(options.runtime_dir)
        prepare_compile_cache(options)
    options = resume_from_for_this_run(options)
    check_resume_from(options)
    if prepare_root:
        say_if_no_checkpoint_is_valid(options)
    return options


def check_script(options: RunOptions) -> None:
    """Refuse a script torchrun could not start, before any process is started."""
    script, mode = Path(options.script), options.launch_mode
    if mode == "module":
        missing = _missing_module_part(str(options.script))
        if missing is not None:
            raise ConfigError(f"module {script} cannot be found: no {missing} in the current "
                              "directory or on sys.path")
    elif mode == "no_python":
        if not (script.is_file() and os.access(script, os.X_OK)) and not shutil.which(
                options.script):
            raise ConfigError(f"{script} is not an executable file (--no-python runs it "
                              "directly); give an executable or drop --no-python")
    else:
        check_python_script(script)
        if mode == "run_path" and not script.is_absolute():
            raise ConfigError(f"--run-path needs an absolute script path, not {script}")


def _missing_module_part(name: str) -> str | None:
    """The first part of the dotted ``name`` that cannot be found, else ``None``. Found on the
    file system without importing anything: importing the user's package could take seconds."""
    search: list[str] | None = [os.getcwd(), *sys.path]
    found = ""
    for part in name.split("."):
        found = f"{found}.{part}" if found else part
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return f"module {found}" if "." in found else f"package {found}"
        search = list(spec.submodule_search_locations or [])
    return None


def check_artifact_path(options: RunOptions, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a preset ``$CHECKPOINT_ARTIFACT_PATH`` that is not the checkpoint root: a script
    that saves there would write where ``cycle run`` does not look, and every stop would wait
    the whole grace for a checkpoint that never comes."""
    preset = (os.environ if environ is None else environ).get(ENV_ISC_ARTIFACT_PATH)
    root = options.layout.root
    if preset and os.path.realpath(preset) != os.path.realpath(root):
        raise ConfigError(
            f"CHECKPOINT_ARTIFACT_PATH is {preset} but the checkpoint root is {root}: a script "
            "that saves to $CHECKPOINT_ARTIFACT_PATH would write where cycle run does not "
            f"look; pass --checkpoint-dir {preset}, or unset CHECKPOINT_ARTIFACT_PATH")


def say_if_no_checkpoint_is_valid(options: RunOptions) -> None:
    """Checkpoints exist and none is valid: said at start, before the workers start over."""
    try:
        problem = no_valid_checkpoint(options.checkpoint_dir, options.checkpoint_name)
    except OSError:
        return
    if problem is not None:
        log.warning("no valid checkpoint in %s (%s): the workers will start from the "
                    "beginning unless they are told to refuse", options.checkpoint_dir, problem)


def resume_from_for_this_run(options: RunOptions) -> RunOptions:
    """``options`` without ``--resume-from`` if this job already rolled back to it.

    A rerun of the same command (Slurm's requeue: ``SLURM_RESTART_COUNT``; anywhere else: the
    record the first run left under ``.cycler/``) must continue from the newest checkpoint,
    not throw away everything since; a checkpoint rotated away meanwhile is then no error.
    """
    if options.resume_from is None:
        return options
    record = options.record.resume_record_path(options.node_rank)
    done = read_json_object(record).get("resume_from") == options.resume_from
    if not (done or options.requeue_count > 0):
        return options
    log.info("--resume-from %s was carried out by an earlier run of this job (%s): "
             "continuing from the newest checkpoint", options.resume_from,
             "a requeue" if options.requeue_count > 0 else record)
    return dataclasses.replace(options, resume_from=None)


def record_resume_from(record: RunRecord, node_rank: int, resume_from: str) -> None:
    """Note that this job rolled back to ``resume_from``, so that a rerun does not again."""
    payload = json.dumps({"resume_from": resume_from, "time": time.time()}).encode()
    record.directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(record.resume_record_path(node_rank), payload, durable=True)


def check_resume_from(options: RunOptions) -> None:
    if options.resume_from is None:
        return
    memory = options.memory_layout
    if memory is not None and is_private(memory.root.parent) and is_private(memory.root):
        try:  # in memory (the memory tier of an earlier run of this job on this node)...
            find_checkpoint(memory.root, options.resume_from, options.checkpoint_name)
            return
        except CyclerError:
            pass  # ...or else on disk, which says what is wrong
    try:
        find_checkpoint(options.checkpoint_dir, options.resume_from, options.checkpoint_name)
    except CyclerError as error:
        raise ConfigError(f"--resume-from: {error}") from None


def prepare_checkpoint_root(options: RunOptions) -> None:
    """Create the root and its ``.cycler/`` (and the lossy directory where ISC's contract asks
    for one: :func:`isc_environment`), refuse any of them that is not the user's alone
    (:func:`check_owned_directory`: another user's, open to others' writes, in a place others
    can rename it out of; ``--shared-root-group`` lets a group in), and prove a file can be
    written in the root and in ``.cycler/``."""
    layout = options.layout
    trust = user_trust(options.shared_root_group)
    options.record.check_directory()
    for directory, what in ((layout.root, "the checkpoint root"),
                            (options.record.directory, "the checkpoint root's .cycler")):
        _make_owned(directory, what, trust, _ROOT_FIX)
    probe_name = f".probe-{socket.gethostname()}-{os.getpid()}"
    try:
        # Both places get written: the savers create checkpoints in the root, the supervisor
        # and the locks write in .cycler/, and either may be the one that is read-only.
        for probe in (layout.root / probe_name, options.record.directory / probe_name):
            probe.write_bytes(b"")
            probe.unlink()
    except OSError as error:
        raise CheckpointDirectoryError(
            f"cannot write to the checkpoint directory {layout.root} ({error.strerror}); "
            "choose a writable --checkpoint-dir"
        ) from None
    lossy = isc_environment(options, os.environ).get(ENV_ISC_LOSSY_PATH)
    if lossy is not None:
        _make_owned(Path(lossy), "LOSSY_ARTIFACT_PATH's directory", trust,
                    "set LOSSY_ARTIFACT_PATH to a directory of yours, or choose another "
                    "--checkpoint-dir")


_ROOT_FIX = ("choose a --checkpoint-dir of your own, or pass --shared-root-group GROUP for a "
             "root you share with GROUP on purpose")


def _make_owned(directory: Path, what: str, trust: Trust, fix: str) -> None:
    """Create ``directory`` if missing, then refuse it unless it is the user's alone (nothing
    is created in a place others could swap)."""
    check_owned_place(directory, what, trust, fix)
    try:
        make_owned_directory(directory, trust)
    except OSError as error:
        why = "no room left" if caused_by_full_disk(error) else error.strerror
        raise CheckpointDirectoryError(f"cannot create {what} {directory} ({why}); "
                                       "choose a writable --checkpoint-dir") from None
    check_owned_directory(directory, what, trust, fix)


def prepare_memory_tier(options: RunOptions) -> None:
    """With ``--memory-tier``: make this job's memory root on this node (private to the user and
    to this job; a root of an earlier job of the user's is removed), prove that a file can be
    written there and that there is room, and remove the user's memory roots that no job can
    resume from any more. Anything that is not the user's is refused with one line (exit 2),
    before a worker starts."""
    memory = options.memory_layout
    if memory is None:
        return
    base = memory.root.parent
    try:
        make_parents_private(base.parent)
    except OSError as error:
        raise CheckpointDirectoryError(f"cannot create the memory directory {base.parent} "
                                       f"({error.strerror}); choose another --memory-dir"
                                       ) from None
    check_safe_parent(base.parent, "the memory directory")
    said = [prepare_memory_root(memory.root, options.record, supervisor=True)]
    _probe_memory_root(memory.root)
    said += sweep_stale_roots(base, keep=memory.root)
    for line in said:
        if line is not None:
            log.warning("%s", line)
    why = overflowed(options.record)
    if why is not None:
        log.warning("the memory tier was too small for this job (%s): checkpoints go to %s; "
                    "remove %s to try memory again", why, options.layout.root,
                    options.record.memory_overflow_path)


def _probe_memory_root(root: Path) -> None:
    """A file can be written in the memory root, and its filesystem has room left."""
    probe = root / f".probe-{socket.gethostname()}-{os.getpid()}"
    try:
        descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             PRIVATE_FILE_MODE)
        try:
            os.write(descriptor, b"\0")
        finally:
            os.close(descriptor)
            probe.unlink()
        free = os.statvfs(root).f_bavail
    except OSError as error:
        raise CheckpointDirectoryError(f"cannot write to the memory root {root} "
                                       f"({error.strerror}); choose another --memory-dir"
                                       ) from None
    if free == 0:
        raise CheckpointDirectoryError(f"the memory root {root} has no room left; free some "
                                       "or choose another --memory-dir")
