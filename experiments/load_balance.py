"""Experiment (b): per-device causal attention work and time, contiguous vs zigzag layout.

For each context degree P and layout of ``experiment=load_balance`` (conf/experiment/
load_balance.yaml), device r's queries are the r-th block of the laid-out sequence:

- work: visible causal (query, key) pairs, :func:`lcx.sharding.layout.causal_work_per_device`
  (exact integer counts), and its max/mean ratio (the step waits for the busiest device);
- time: forward+backward of :func:`lcx.attention.flash_attention` (xla kernel, causal mask,
  global positions) of those queries against all S keys, on one CPU device -- the work device r
  does under the all-gather strategy. The kernel skips tiles the mask hides entirely, so time
  follows work. The minimum of ``repeats`` runs after a warm-up: on a shared machine other
  jobs only ever add time, so the minimum is the least disturbed measurement.

Writes ``experiments/results/load_balance.csv`` and ``.png``. With ``--documents``, the packed-
document rows instead (experiments/_documents.py: lcx's stdlib and passkey data, contiguous,
zigzag and balanced, visible pairs per device and executed / visible kernel tiles, counted
exactly): ``experiments/results/load_balance_documents.csv`` and ``.png``.

    python experiments/load_balance.py          # ~1-3 min on 2 cores
    python experiments/load_balance.py --documents   # a few minutes; nothing compiles
    python experiments/load_balance.py load_balance.seq_len=4096 load_balance.repeats=1
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "load_balance"


def work_rows(seq_len: int, degrees, layouts) -> list[dict]:
    """Per-device visible-pair counts (no timing)."""
    from lcx.sharding.layout import causal_work_per_device

    rows = []
    for P in degrees:
        for layout in layouts:
            w = causal_work_per_device(layout, seq_len, P)
            for r, pairs in enumerate(w):
                rows.append(
                    {
                        "layout": layout,
                        "degree": P,
                        "device": r,
                        "seq_len": seq_len,
                        "pairs": int(pairs),
                        "pairs_over_mean": float(pairs / w.mean()),
                        "imbalance_max_over_mean": float(w.max() / w.mean()),
                    }
                )
    return rows


def time_rows(rows: list[dict], model, block: int, repeats: int) -> None:
    """Add ``fwd_bwd_s`` (minimum seconds over ``repeats`` runs) to each row in place."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from lcx.attention import CAUSAL, XlaKernel, flash_attention
    from lcx.sharding.layout import layout_permutation

    N, K, H = int(model.n_heads), int(model.n_kv_heads), int(model.head_dim)
    kernel = XlaKernel(block_q=block, block_kv=block)
    cache = {}
    for row in rows:
        S, P, r = row["seq_len"], row["degree"], row["device"]
        T = S // P
        key = (S, T)
        if key not in cache:

            def loss(q, k, v, q_pos, k_pos):
                seg_q = jnp.ones(q_pos.shape, jnp.int32)
                seg_k = jnp.ones(k_pos.shape, jnp.int32)
                return flash_attention(q, k, v, q_pos, k_pos, seg_q, seg_k, mask=CAUSAL, kernel=kernel).sum()

            cache[key] = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        f = cache[key]
        rng = np.random.default_rng(0)
        q = jnp.asarray(rng.standard_normal((1, T, N, H)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((1, S, K, H)), jnp.float32)
        v = jnp.asarray(rng.standard_normal((1, S, K, H)), jnp.float32)
        perm = layout_permutation(row["layout"], S, P)
        q_pos = jnp.asarray(perm.reshape(P, T)[r][None], jnp.int32)
        k_pos = jnp.arange(S, dtype=jnp.int32)[None]
        jax.block_until_ready(f(q, k, v, q_pos, k_pos))  # compile + warm-up
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(f(q, k, v, q_pos, k_pos))
            ts.append(time.perf_counter() - t0)
        row["fwd_bwd_s"] = min(ts)
        print(f"  {row['layout']:>10} P={P} device {r}: {row['pairs']:>10} pairs, {row['fwd_bwd_s']:.3f} s", flush=True)


def plot(rows: list[dict], path: pathlib.Path, note: str = "") -> pathlib.Path:
    plt = C.pyplot()
    degrees = sorted({int(r["degree"]) for r in rows})
    timed = all("fwd_bwd_s" in r and r["fwd_bwd_s"] not in ("", None) for r in rows)
    fig, axes = plt.subplots(
        len(degrees), 2 if timed else 1, figsize=(11 if timed else 6, 3.4 * len(degrees)), squeeze=False
    )
    for i, P in enumerate(degrees):
        for j, (field, label) in enumerate(
            [("pairs", "visible causal (q, k) pairs"), ("fwd_bwd_s", "fwd+bwd time (s)")][: 2 if timed else 1]
        ):
            ax = axes[i][j]
            width = 0.4
            for k, layout in enumerate(("contiguous", "zigzag")):
                rs = sorted(
                    (r for r in rows if int(r["degree"]) == P and r["layout"] == layout), key=lambda r: int(r["device"])
                )
                if not rs:
                    continue
                xs = [int(r["device"]) + (k - 0.5) * width for r in rs]
                vals = [float(r[field]) for r in rs]
                mean = sum(vals) / len(vals)
                ax.bar(xs, vals, width, label=f"{layout} (max/mean {max(vals) / mean:.2f})")
            ax.set_xticks(range(P))
            ax.set_xlabel("context-parallel device")
            ax.set_ylabel(label)
            ax.set_title(f"P = {P}, S = {rows[0]['seq_len']}")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"causal load balance per device{note}")
    return C.save_figure(fig, path)


def documents(spec, out: pathlib.Path) -> int:
    """The packed-document rows of every (data, length) of ``spec``; CSV and plot."""
    import _documents as D

    rows = []
    for data in spec.data:
        for S in spec.seq_lens:
            rows += D.measure(str(data), int(S), [int(p) for p in spec.degrees], int(spec.rows), int(spec.block))
    C.write_csv(rows, C.out_file(out, ".csv"))
    D.plot(rows, C.out_file(out, ".png"))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-time", action="store_true", help="count work only (seconds, no kernel runs)")
    ap.add_argument("--documents", action="store_true", help="the packed-document rows (counted, not timed)")
    ap.add_argument("--out", type=pathlib.Path, default=C.RESULTS / NAME)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. load_balance.seq_len=4096")
    a = ap.parse_args(argv)
    cfg = C.compose(NAME, a.overrides)
    lb = cfg.load_balance
    if a.documents:
        return documents(lb.documents, a.out.parent / f"{a.out.name}_documents")
    rows = work_rows(int(lb.seq_len), [int(p) for p in lb.degrees], list(lb.layouts))
    if not a.no_time:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        time_rows(rows, cfg.model, int(lb.block), int(lb.repeats))
        for P in {r["degree"] for r in rows}:
            for layout in {r["layout"] for r in rows}:
                rs = [r for r in rows if r["degree"] == P and r["layout"] == layout]
                mean = sum(r["fwd_bwd_s"] for r in rs) / len(rs)
                for r in rs:
                    r["time_max_over_mean"] = max(x["fwd_bwd_s"] for x in rs) / mean
    C.write_csv(rows, C.out_file(a.out, ".csv"))
    plot(rows, C.out_file(a.out, ".png"), f" ({C.machine_note()}, model={cfg.model.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
