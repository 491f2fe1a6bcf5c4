"""The last step of every commit (docs/design.md, "Commit protocol"): the manifest written into the
checkpoint's directory, then the latest link moved to it. Every writer ends with it: a saver's
commit rounds, persisting, the nodes' contributions and fetches; it imports no writer, and the
supervisor persists through it without importing torch."""

from __future__ import annotations

from cycler import _fs
from cycler._private import restrict_tree
from cycler.checkpoint.layout import MANIFEST_NAME, CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import list_checkpoints
from cycler.checkpoint.manifest import Manifest
from cycler.protocol.node_local import note_commit


def finalize(layout: CheckpointLayout, name: CheckpointName, manifest: Manifest, *,
             forward: bool = False, private: bool = False) -> None:
    """The last step of every commit in ``layout``: write the manifest of ``name``'s directory,
    whose files and subdirectories are durable already, and then point the latest link at it;
    with ``forward`` (writers that commit in one root concurrently or out of order: persisting,
    the nodes' contributions), see :func:`link_forward`. With ``private`` (a memory root), the
    directory's files are made 0600 and its directories 0700 before the link, and the records
    beside them too, whatever the umask they were written with."""
    directory = layout.path_of(name)
    _fs.atomic_write_bytes(directory / MANIFEST_NAME, manifest.to_json().encode())
    if private:
        restrict_tree(directory)
        restrict_tree(layout.record.directory)
    if forward:
        link_forward(layout)
    else:  # a saver's own commit: indices only grow, so it is the newest
        _fs.atomic_symlink(directory, layout.link_path)
    note_commit()


def link_forward(layout: CheckpointLayout) -> None:
    """Point the latest link at the newest committed checkpoint if it names an older one (or
    none). Each writer calls it after its own commit, so whichever swaps last leaves the link
    on the newest: it never moves back."""
    linked = layout.link_target_name()
    for checkpoint in reversed(list_checkpoints(layout.root, layout.prefix,
                                                commit_state_only=True)):
        if linked is not None and checkpoint.index <= linked.index:
            return
        if checkpoint.valid:
            _fs.atomic_symlink(checkpoint.path, layout.link_path)
            return
