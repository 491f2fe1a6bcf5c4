"""The memory tier of a job on several nodes: node manifests, the partner copy, persisting by
contribution and the resume that assembles a checkpoint from what the nodes hold
(docs/design.md, "Tiers").

With several nodes, a node's memory root holds only what its own ranks wrote. A checkpoint is
committed there by the node's first local rank (its *leader*) under a *node manifest*: the
node's own files with their checksums, and beside them the job's manifest (every file of every
node) as ``cycler-job-manifest.json``, which the node manifest covers too. So each node's memory
root stays a checkpoint root like any other: listed, retained and pruned by the same rules.

**The partner copy.** After each commit every leader sends its node's files to the next node's
leader (a ring: node r to node r+1) over a gloo group of the leaders, in the saver's background
thread; the receiver keeps them under ``.replicas/<checkpoint>/`` and writes the sender's node
manifest there last, once every file read back with its checksum. The exchange is in lockstep
(every leader sends and receives the same number of chunks per checkpoint), so a file that cannot
be read is sent as zeros and fails the receiver's checksums instead of stalling the ring.

**Persisting.** Every node contributes the files it holds (its own and its partner copy) to the
checkpoint root's directory of that checkpoint: each file is copied under a temporary name,
verified against the job manifest and renamed into place. The contribution that completes the
set writes the job manifest there and moves the durable link forward. No node waits for
another, and a kill at any moment leaves a directory without a manifest (torn).

**Resume.** The leaders report what they hold; rank 0 picks the newest checkpoint whose files
the nodes hold between them, if it is at least as new as the checkpoint root's newest, and tells
each node which files to fetch from which node. Once fetched, every node holds the whole
checkpoint in its memory root under the job manifest, every rank verifies its node's share of
the checksums, and all load it; any failure falls back to the checkpoint root.

The modules, one job each: :mod:`.topology` (a rank's place, the leaders' group),
:mod:`.transport` (bytes between leaders), :mod:`.node_commit` (a node's manifests),
:mod:`.partner_copy`, :mod:`.contribution` (persisting) and :mod:`.assembly` (the resume). A
second replication strategy is a module beside :mod:`.partner_copy`, called from
:class:`cycler.checkpoint.persisting.Persister` and from :mod:`.assembly`'s plan.
"""
