"""The compile cache (docs/compile-cache.md): kept on the node, carried in the checkpoint root.

- :mod:`.place`: the node cache's place, its key, the workers' environment, its preparation
  before the workers start (filled from the archive when the key matches).
- :mod:`.archive`: the archive carried in the checkpoint root (one tar, its
  :class:`~.archive.CacheKey` first): pack and unpack.
- :mod:`.carrier`: the thread that carries the node cache into the archive while the run goes.

place and carrier import archive; nothing here imports them back.
"""
