"""The checkpoint part of cycler, split by responsibility (docs/design.md):

- :mod:`.layout`: checkpoint names, indices and the latest link (their one owner; the
  records under ``.cycler/`` are :mod:`cycler.protocol.record`'s);
- :mod:`.manifest` and :mod:`.checksum`: what a committed checkpoint holds, and its checksums;
- :mod:`.saving`: ``atomic_torch_save``, one file at a time;
- :mod:`.atomic_directory`: the saver, a facade over the parts below;
- :mod:`.placement`: which tier and index the next checkpoint gets;
- :mod:`.commit`: the prepare and commit rounds across ranks;
- :mod:`.linking`: the last step of every commit (the manifest, then the latest link);
- :mod:`.retainer`: the one executor of retention, and the one place a checkpoint directory
  is removed;
- :mod:`.persisting`: the memory tier's background copies to the checkpoint root;
- :mod:`.durable_copy`: one memory checkpoint copied to the checkpoint root, verified,
  committed;
- :mod:`.dcp`: torch.distributed.checkpoint saves, synchronous and asynchronous;
- :mod:`.in_flight`: the saves in flight, and the stop's, exit's and teardown's waits for them;
- :mod:`.tiers`: the memory tier: its root, its room, its overflow;
- :mod:`.memory_roots` (and the helpers' :mod:`cycler._private`): where the memory tier
  lives and whose it is (the user's private directories, the job's id), checked before
  anything there is read;
- :mod:`.nodes`: the memory tier on several nodes (partner copy, contribution, assembly);
- :mod:`.resume` and :mod:`.coordination`: which checkpoint every rank resumes from, and the
  store rounds in which one rank decides and every rank learns;
- :mod:`.listing` and :mod:`.verification`: what is on disk, which checkpoint is the latest
  valid one, and which ones failed their checksums;
- :mod:`.retention`: which checkpoints to keep (pure functions, carried out by the retainer);
- :mod:`.inspection`: ``cycle status`` and ``cycle prune``;
- :mod:`.lock`: the supervisor's and the writer's locks.

Imports only ``cycler.protocol`` and the helpers. The public names are re-exported by
:mod:`cycler`; import them from there.
"""
