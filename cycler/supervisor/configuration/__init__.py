"""The run's options: what ``cycle run`` is told, resolved once into :class:`RunOptions`.

- :mod:`.options`: :class:`~.options.RunOptions`, their declarations and their resolution from
  flags, the ``--config`` file and the scheduler's environment.
- :mod:`.flags`: the command line's spellings of the options.
- :mod:`.config_file`: the ``--config`` YAML file, read and checked.

Below it: :mod:`cycler.supervisor.schedulers` (the environment a scheduler sets, the cloud
notices' modes) and :mod:`cycler.supervisor.nodes` (the nodes' timeouts).
"""
