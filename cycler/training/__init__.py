"""The worker's side of the stop protocol: StepControl and its exchange between ranks, RNG
streams, resumable metrics, epochs and readiness.

Imports ``cycler.checkpoint`` (only to wait for the saves in flight) and ``cycler.protocol`` (the
control file, the stop signals' shield, the progress beacons); ``cycler.data`` is allowed too;
never ``cycler.supervisor``.
"""
