"""What the supervisor learns from, and asks of, a scheduler or a cloud.

- :mod:`.slurm`: Slurm's job (its time limit, the hard deadline of a stop), ``scontrol
  requeue``.
- :mod:`.environment`: the environment a scheduler sets (Slurm, ISC), read into options.
- :mod:`.notices`: cloud preemption notices as stop requests (AWS, Google, Azure).

Imports no other wing.
"""
