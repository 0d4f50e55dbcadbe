"""Causal work imbalance of each sequence layout: counted for one document, measured for packed ones.

The ledger stretches a ring's (or all-gather's) attention time by max/mean visible pairs over
the context-parallel devices: the step waits for the busiest. For one document per row the value
is counted exactly (:func:`causal_imbalance`: contiguous ``(2P - 1) / P``, zigzag 1). Rows that
pack several documents under a causal AND document mask balance differently,
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


def causal_imbalance(layout: str, degree: int, *, packed_documents: bool = False, seq_len: int = 0) -> float:
    """Max/mean causal attention work over ``degree`` devices, counted in chunk-pair cells.

    With ``packed_documents`` (rows pack several documents under a document mask) the value is
    the layout's measured one on lcx's packed data at the nearest measured ``(seq_len, degree)``
    (:func:`packed_imbalance`); the rest of this docstring is one document.

    The sequence is cut into ``2P`` chunks; the causal work of chunk pair (i, j <= i) is one cell
    off the diagonal and half a cell on it ((2P)^2 / 2 in all). Contiguous: device r holds chunks
    2r, 2r+1 and does ``4r + 2`` cells (2, 6, 10, 14 for P=4), max/mean ``(2P - 1) / P`` (1.75 at P=4, 1.875
    at P=8). Zigzag: device r holds chunks r and 2P-1-r, exactly ``2P`` cells each: 1.0.
    (Counted here; exact at the token level up to the diagonal, see
    :func:`lcx.sharding.causal_work_per_device`.) Balanced: on one document its equal-count
    chunk assignment equalises the work as zigzag does: 1.0.
    """
    if packed_documents and degree > 1:
        return packed_imbalance(layout, seq_len, degree)
    if degree <= 1 or layout in ("zigzag", "balanced"):
        return 1.0
    if layout != "contiguous":
        raise ValueError(f"unknown layout {layout!r}")
    work = causal_half_block_work(layout, degree)
    return max(work) / (sum(work) / degree)


def causal_half_block_work(layout: str, degree: int) -> list[int]:
    """Causal work per device in cells of the ``2P x 2P`` grid of chunk pairs, a diagonal cell
    counting half (see :func:`causal_imbalance`). O(P)."""
    P = degree
    if layout == "contiguous":
        owned = [(2 * r, 2 * r + 1) for r in range(P)]
    elif layout == "zigzag":
        owned = [(r, 2 * P - 1 - r) for r in range(P)]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    # chunk i attends to the i chunks before it fully and to itself half: i + 1/2 cells; a device
    # owns two chunks, so its total i + j + 1 is an integer
    return [sum(2 * i + 1 for i in chunks) // 2 for chunks in owned]
