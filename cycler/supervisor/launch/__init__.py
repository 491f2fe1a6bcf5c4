"""Starting the workers: torchrun's command, its agent, and the process tree.

- :mod:`.torchrun`: the launch plan (torchrun's command line and environment).
- :mod:`.launcher`: torchrun's entry point, ``python -m cycler.supervisor.launch.launcher``
  (cheap to import: it runs at every start of the workers).
- :mod:`.forked`: workers forked from the agent, which imported torch once.
- :mod:`.fresh_worker`: a worker's start in a process of its own.
- :mod:`.script_source`: the training script, file or module, as the launcher runs it.
- :mod:`.startable`: checks that a start can work (a free port).
- :mod:`.processes`: torchrun's process tree: start, signals, reaping, the watchdog.
"""
