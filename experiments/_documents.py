"""Packed-document load balance (experiments/load_balance.py ``--documents``): counted, not timed.

Under a causal AND document mask a query at position ``p`` of its document piece sees ``p + 1``
keys, so each device's work is exact from positions and segment ids
(:func:`lcx.sharding.layout.document_work_per_device`, no S^2 array). For every data source,
length S and context degree P of ``load_balance.documents``, the first ``rows`` training rows
of that source (the trainer's own stream, seed 0) are laid out contiguous, zigzag and balanced,
and per row this measures:

- ``max_over_mean``: the busiest device's visible pairs over the mean (the ring waits for it);
- ``executed_over_visible_tiles``: kernel tiles of ``block`` x ``block`` tokens that the
  kernels' block test (:meth:`lcx.attention.Mask.may_be_visible`: min/max of positions and
  segment ids) cannot skip, in pairs, over the visible pairs -- the block-level waste a layout
  costs. Blocks are consecutive tokens of the laid-out row, which is what each device's kernel
  tiles (all-gather: local queries against the laid-out K/V; ring: each hop's shard); the tile is
  ``min(block, S / 2P)`` (the kernels' tile may not exceed a zigzag chunk) for every layout.

Both are averaged over the rows (``*_mean``; ``max_over_mean_worst`` is the worst row), with the
balanced layout's host cost per row (``layout_ms``).
"""

from __future__ import annotations

import time

import numpy as np

LAYOUTS = ("contiguous", "zigzag", "balanced")


def rows_of(data: str, seq_len: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(positions, segment_ids) of the first ``n`` training rows of ``data`` (original order)."""
    import _common as C

    from lcx.config.run import data_config
    from lcx.data.sources import SOURCES
    from lcx.data.stream import BatchSpec

    cfg = C.compose(None, [f"data={data}"])
    spec = BatchSpec(seq_len=seq_len, global_batch=1, layout="contiguous", context_degree=1, seed=0, val_global_batch=1)
    stream = iter(SOURCES[data](data_config(cfg.data), spec).train)
    out = []
    for _ in range(n):
        b = next(stream)
        out.append((b["positions"][0].astype(np.int64), b["segment_ids"][0].astype(np.int64)))
    return out


def tiles_executed(pos: np.ndarray, seg: np.ndarray, block: int) -> int:
    """Tiles of one laid-out row the kernels' min/max block test cannot skip (causal + document)."""
    p = pos.reshape(-1, block)
    s = seg.reshape(-1, block)
    p_lo, p_hi, s_lo, s_hi = p.min(1), p.max(1), s.min(1), s.max(1)
    q, k = np.s_[:, None], np.s_[None, :]
    ok = p_lo[k] <= p_hi[q]  # causal: some key at or before some query
    ok &= (s_hi[k] >= s_lo[q]) & (s_lo[k] <= s_hi[q])  # segment ranges overlap
    ok &= (s_hi[q] >= 0) & (s_hi[k] >= 0)  # not all padding
    return int(ok.sum())


def measure(data: str, seq_len: int, degrees, n_rows: int, block: int) -> list[dict]:
    from lcx.sharding.layout import document_work_per_device, layout_permutation

    rows = rows_of(data, seq_len, n_rows)
    out = []
    for P in degrees:
        # the kernels' tile: at most a zigzag chunk (S / 2P), which a ring hop's kernel tiles
        tile = min(block, seq_len // (2 * P))
        acc = {lay: {"ratio": [], "tiles": [], "ms": []} for lay in LAYOUTS}
        for pos, seg in rows:
            visible = int(np.where(seg >= 0, pos + 1, 0).sum())
            for lay in LAYOUTS:
                t0 = time.perf_counter()
                perm = layout_permutation(lay, seq_len, P, positions=pos, segment_ids=seg, block=tile)
                acc[lay]["ms"].append(1e3 * (time.perf_counter() - t0))
                w = document_work_per_device(perm, pos, seg, P)
                acc[lay]["ratio"].append(w.max() / w.mean())
                acc[lay]["tiles"].append(tiles_executed(pos[perm], seg[perm], tile) * tile**2 / visible)
        for lay in LAYOUTS:
            a = acc[lay]
            out.append(
                {
                    "data": data,
                    "layout": lay,
                    "seq_len": seq_len,
                    "P": P,
                    "rows": len(rows),
                    "block": tile,
                    "max_over_mean": float(np.mean(a["ratio"])),
                    "max_over_mean_worst": float(np.max(a["ratio"])),
                    "executed_over_visible_tiles": float(np.mean(a["tiles"])),
                    "layout_ms": float(np.median(a["ms"])),
                }
            )
            print(
                f"  {data:>8} S={seq_len:>7} P={P:>3} {lay:>10}: max/mean {out[-1]['max_over_mean']:.3f} "
                f"(worst {out[-1]['max_over_mean_worst']:.3f}), executed/visible tiles "
                f"{out[-1]['executed_over_visible_tiles']:.3f}, {out[-1]['layout_ms']:.2f} ms/row",
                flush=True,
            )
    return out


def plot(rows: list[dict], path):
    """max/mean visible pairs against P, one panel per (data, length), a line per layout."""
    import _common as C

    plt = C.pyplot()
    panels = sorted({(r["data"], r["seq_len"]) for r in rows})
    fig, axes = plt.subplots(2, len(panels), figsize=(3.6 * len(panels), 6.4), squeeze=False)
    for j, (data, S) in enumerate(panels):
        for lay in LAYOUTS:
            rs = sorted(
                (r for r in rows if (r["data"], r["seq_len"], r["layout"]) == (data, S, lay)), key=lambda r: r["P"]
            )
            Ps = [r["P"] for r in rs]
            axes[0][j].plot(Ps, [r["max_over_mean"] for r in rs], marker="o", label=lay)
            axes[1][j].plot(Ps, [r["executed_over_visible_tiles"] for r in rs], marker="o", label=lay)
        for i, label in enumerate(("max/mean visible pairs", "executed / visible tile pairs")):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context-parallel degree P")
            ax.set_ylabel(label)
            ax.set_title(f"{data}, S = {S // 1024}K", fontsize=9)
            ax.grid(alpha=0.3)
        axes[0][j].legend(fontsize=7)
    fig.suptitle("packed documents, causal + document mask: work per device and block-level waste")
    return C.save_figure(fig, path)
