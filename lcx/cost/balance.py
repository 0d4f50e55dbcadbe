"""Causal work imbalance of each sequence layout: counted for one document, measured for packed ones.

The ledger stretches a ring's (or all-gather's) attention time by max/mean visible pairs over
the context-parallel devices: the step waits for the busiest. For one document per row the value
is counted exactly (:func:`lcx.cost.ledger.causal_imbalance`: contiguous ``(2P - 1) / P``, zigzag
1). Rows that pack several documents under a causal AND document mask balance differently,
because the visible pairs depend on where the boundaries fall: the values below are measured on
lcx's own packed data (``data=stdlib``, the training stream's first 100 rows per length) by
``python experiments/load_balance.py --documents``
(``experiments/results/load_balance_documents.csv``, column ``max_over_mean``: the mean over rows
of each row's busiest device over the mean device). Another corpus packs other lengths; these
are the default data's.
"""

from __future__ import annotations

import math

# (seq_len, P) -> max/mean, per layout; from load_balance_documents.csv (data=stdlib), printed by
# experiments/report_balance.py's packed_imbalance_table (tests/test_layout_balanced.py compares)
# fmt: off
PACKED_IMBALANCE: dict[str, dict[tuple[int, int], float]] = {
    "contiguous": {(16384, 4): 1.764, (16384, 8): 1.968, (16384, 16): 2.080, (16384, 64): 2.173, (65536, 4): 1.749, (65536, 8): 2.114, (65536, 16): 2.306, (65536, 64): 2.497, (262144, 4): 1.743, (262144, 8): 2.334, (262144, 16): 2.852, (262144, 64): 3.381},
    "zigzag": {(16384, 4): 1.175, (16384, 8): 1.206, (16384, 16): 1.215, (16384, 64): 1.230, (65536, 4): 1.338, (65536, 8): 1.427, (65536, 16): 1.496, (65536, 64): 1.537, (262144, 4): 1.601, (262144, 8): 1.888, (262144, 16): 2.067, (262144, 64): 2.168},
    "balanced": {(16384, 4): 1.003, (16384, 8): 1.014, (16384, 16): 1.094, (16384, 64): 1.099, (65536, 4): 1.004, (65536, 8): 1.004, (65536, 16): 1.004, (65536, 64): 1.272, (262144, 4): 1.005, (262144, 8): 1.004, (262144, 16): 1.004, (262144, 64): 1.004},
}
# fmt: on


def packed_imbalance(layout: str, seq_len: int, degree: int) -> float:
    """Measured max/mean visible pairs of ``layout`` on packed documents at the measured (S, P)
    nearest to ``(seq_len, degree)`` in log scale (1.0 at ``degree <= 1``).

    Raises:
      ValueError: a layout without measurements (the message names the measured ones).
    """
    if degree <= 1:
        return 1.0
    table = PACKED_IMBALANCE.get(layout)
    if not table:
        raise ValueError(f"no packed-document measurement of layout {layout!r}; measured: {sorted(PACKED_IMBALANCE)}")
    key = min(table, key=lambda k: (abs(math.log(k[0] / seq_len)) + abs(math.log(k[1] / degree)), -k[1]))
    return table[key]
