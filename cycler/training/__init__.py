"""The worker's side of the stop protocol: StepControl and its exchange between ranks, stray
signals, RNG streams, resumable metrics, epochs and readiness.

Imports ``cycler.checkpoint``, ``cycler.data`` and ``cycler.protocol``; never ``cycler.supervisor``.
"""
