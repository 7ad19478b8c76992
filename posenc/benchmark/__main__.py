"""Worker process of :mod:`posenc.benchmark` (started by ``worker.run_in_worker``, not by hand)."""

from posenc.benchmark.worker import main

main()
