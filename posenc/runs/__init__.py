"""The generic run machinery: it calls the run-kind contract and names no kind.

- :mod:`posenc.runs.config`: loading configs, overrides, validation (each kind checks its part).
- :mod:`posenc.runs.train`: the training loop, one step function for every kind.
- :mod:`posenc.runs.drope`: DroPE, a run continued from another with its positional encoder
  dropped (``train.drop_positions``, ``posenc train --drop-positions``).
- :mod:`posenc.runs.evaluate`: the evaluation driver (what is scored is the run kind's).
- :mod:`posenc.runs.plan`: ``posenc plan``, compiling a run's steps without running them.
- :mod:`posenc.runs.sweep`: sweeps of runs, resumable point by point.
- :mod:`posenc.runs.trained`: ``posenc.load_run``, a trained or imported run from Python.

Above the run kinds (:mod:`posenc.kinds`), below the CLI.
"""
