"""The checkpoint part of cycler, split by responsibility (DESIGN.md):

- :mod:`.layout`: names, the root's entries, ``.cycler/`` (the one owner of naming);
- :mod:`.manifest` and :mod:`.checksum`: what a committed checkpoint holds, and its checksums;
- :mod:`.saving`: ``atomic_torch_save``, one file at a time;
- :mod:`.atomic_directory`: the saver and its commit across ranks;
- :mod:`.sharded`: torch.distributed.checkpoint saves, synchronous and asynchronous, and the
  saves in flight that a stop and the interpreter's exit wait for;
- :mod:`.coordination`: the rounds in which ranks agree through the process group's store;
- :mod:`.resume`: the one checkpoint every rank resumes from;
- :mod:`.tiers`: the memory tier (``cycle run --memory-tier``) and persisting to the root;
- :mod:`.replicas`: the memory tier on several nodes (node manifests, the partner copy,
  assembling a checkpoint from what the nodes hold);
- :mod:`.listing` and :mod:`.verification`: what is on disk, which checkpoint is the latest
  valid one, and which ones failed their checksums;
- :mod:`.retention`: which checkpoints to keep (a pure function);
- :mod:`.inspection`: ``cycle status`` and ``cycle prune``;
- :mod:`.lock`: the supervisor's and the writer's locks.

Imports only ``cycler.protocol`` and the helpers. The public names are re-exported by
:mod:`cycler`; import them from there.
"""
