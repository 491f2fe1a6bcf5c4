"""The nodes of a job on several nodes, as one node's supervisor sees them.

- :mod:`.peers`: heartbeats and the watch over the other nodes (a node gone, a requeue).
- :mod:`.store_link`: the link to the job's store that carries the heartbeats and stops.
- :mod:`.root_io`: the checkpoint root's calls while the workers train, off the loop.

Imports no other wing.
"""
