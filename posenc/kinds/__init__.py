"""Run kinds: one module per kind of run behind the run-kind contract."""
