"""What the entry points print and write at the end of a job: the planner's report
(:mod:`lcx.reports.plan`, with MaxText's published recipes in :mod:`lcx.reports.maxtext`), the
retrieval eval's (:mod:`lcx.reports.passkey`) and a training run's last line
(:mod:`lcx.reports.train`). Each reads the library (cost, training, sharding) and owns no numbers."""
