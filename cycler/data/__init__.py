"""What the training loop reads, resumable: samplers, epoch orders, sharded datasets.

Imports only the helpers (``cycler.errors``); never the checkpoint, training or supervisor parts.
"""
