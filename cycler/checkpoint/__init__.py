"""The checkpoint half of cycler, split by responsibility (DESIGN.md):

- :mod:`.layout`: names, the root's entries, ``.cycler/`` (the one owner of naming);
- :mod:`.manifest` and :mod:`.checksum`: what a committed checkpoint holds, and its checksums;
- :mod:`.saving`: ``atomic_torch_save``, one file at a time;
- :mod:`.atomic_directory`: the saver and its commit across ranks;
- :mod:`.sharded`: torch.distributed.checkpoint saves, synchronous and asynchronous;
- :mod:`.listing`: what is on disk, which checkpoint is the latest valid one;
- :mod:`.retention`: which checkpoints to keep (a pure function);
- :mod:`.inspection`: ``cycle status`` and ``cycle prune``;
- :mod:`.lock`: the supervisor's and the writer's locks.

The public names are re-exported by :mod:`cycler`; import them from there.
"""
