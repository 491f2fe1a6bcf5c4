"""Thin adapters for the stacks people train with (optional extras; the core never imports them).

- :mod:`cycler.integrations.transformers`: ``Trainer(..., callbacks=[CyclerCallback()])``
  (extra ``torch-cycler[transformers]``);
- :mod:`cycler.integrations.lightning`: ``Trainer(callbacks=[CyclerCallback()])``
  (extra ``torch-cycler[lightning]``);
- :mod:`cycler.integrations.accelerate`: ``AccelerateLoop(accelerator)`` around an Accelerate
  loop (extra ``torch-cycler[accelerate]``);
- :mod:`cycler.integrations.loop`: hand-written loops whose state lives in local variables.

Each one gives the stack cycler's guarantees (docs/integrations.md): the stack's per-step hook
calls the per-step decision, its own save goes through the atomic commit, the resume restores
what the stack's own resume restores plus what it forgets, and a stop ends training without the
stack's "training finished" path.
"""
