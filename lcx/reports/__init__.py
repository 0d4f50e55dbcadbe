"""Everything lcx renders, in one room: what the entry points print and write at the end of a job.

The planner's report (:mod:`lcx.reports.plan`: the ledger of the given plan, then the search) is
made of the planner's reasons in words (:mod:`lcx.reports.planner`), its candidates as a table
(:mod:`lcx.reports.candidates`), the time model's predictions in words (:mod:`lcx.reports.timing`)
and the comparison with MaxText's published recipes (:mod:`lcx.reports.maxtext`); beside it the
retrieval eval's (:mod:`lcx.reports.passkey`), the long-context tasks scored by generation with
their effective length and loss by position (:mod:`lcx.reports.ruler`) and a training run's last line
(:mod:`lcx.reports.train`). Each reads the library (cost, training, sharding) and owns no numbers:
:mod:`lcx.cost` computes them and renders none."""
