"""What the shell watches in the workers while they train.

- :mod:`.hangs`: the workers' progress, a hang and its stacks.
- :mod:`.replay_watch`: a restart's replayed steps against the earlier run's.
"""
