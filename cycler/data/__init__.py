"""What the training loop reads, resumable: samplers, epoch orders, sharded datasets.

Imports only the helpers (``cycler.errors``, ``cycler._distributed``); never the checkpoint,
training or supervisor parts.
"""
