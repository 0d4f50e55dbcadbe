"""Per-device memory and wall time of the four context-parallel attention strategies.

For each strategy (allgather, a2a, ring, usp 2x4) on 8 simulated CPU devices, B=1, 8 heads
(MHA), head_dim 64, float32, causal mask, zigzag layout:

- per-device temporary memory (bytes -> MiB) of the compiled forward and forward+backward, from
  ``jax.jit(...).lower(...).compile().memory_analysis().temp_size_in_bytes``;
- forward+backward wall time in seconds (median of ``--repeats`` runs after one warm-up);

plus ring memory at P = 2, 4, 8 devices for a fixed sequence length (its O(S/P) scaling).
Sequence lengths in ``--memory-only`` are compiled for memory but not timed (at 65536 tokens one
fwd+bwd takes many minutes on 2 cores). The 8 simulated devices share the machine's cores, so
wall time measures total work, not parallel speed.

Writes a markdown table (``--md``, default docs/strategy_benchmark.md) and a CSV (``--csv``).

    python experiments/bench_strategies.py                      # ~10-20 minutes on 2 cores
    python experiments/bench_strategies.py --seqs 4096 --memory-only --ring-seq 4096   # quick
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402

from lcx.attention import Mask, attention  # noqa: E402
from lcx.sharding import AttentionConfig, Plan, bind  # noqa: E402

B, N, H = 1, 8, 64
MIB = 2**20


def mesh_plan(strategy: str, n_devices: int, block: int):
    if strategy == "usp":
        mesh, seq = (("ulysses", 2), ("ring", n_devices // 2)), ("ulysses", "ring")
    else:
        mesh, seq = (("data", 1), ("context", n_devices)), "context"
    plan = Plan(
        mesh=mesh,
        activations={"batch": "data" if strategy != "usp" else None, "seq": seq},
        attention=AttentionConfig(strategy=strategy, layout="zigzag", block_q=block, block_kv=block),
    )
    return bind(plan, jax.devices()[:n_devices])


def build(mp, S: int):
    """Abstract sharded inputs and the jitted forward / forward+backward functions."""
    mask = Mask()  # causal
    qs = mp.activation_sharding(("batch", "seq", "heads", "head_dim"))
    ps = mp.activation_sharding(("batch", "seq"))
    x = jax.ShapeDtypeStruct((B, S, N, H), jnp.float32, sharding=qs)
    p = jax.ShapeDtypeStruct((B, S), jnp.int32, sharding=ps)

    def fwd(q, k, v, pos, seg):
        return attention(q, k, v, plan=mp, mask=mask, positions=pos, segment_ids=seg)

    def fwd_bwd(q, k, v, pos, seg, do):
        out, vjp = jax.vjp(lambda q, k, v: fwd(q, k, v, pos, seg), q, k, v)
        return out, vjp(do)

    return (x, x, x, p, p), x, jax.jit(fwd), jax.jit(fwd_bwd)


def concrete(mp, S: int, layout_degree: int):
    """Random inputs in the zigzag layout (positions permuted like the data pipeline does)."""
    from lcx.sharding import apply_layout

    ks = jax.random.split(jax.random.key(0), 4)
    qs = mp.activation_sharding(("batch", "seq", "heads", "head_dim"))
    ps = mp.activation_sharding(("batch", "seq"))
    arrs = [jax.device_put(jax.random.normal(k_, (B, S, N, H), jnp.float32), qs) for k_ in ks]
    pos = apply_layout(jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S)), "zigzag", layout_degree, axis=1)
    pos = jax.device_put(pos, ps)
    seg = jax.device_put(jnp.zeros((B, S), jnp.int32), ps)
    q, k, v, do = arrs
    return q, k, v, pos, seg, do


def measure(strategy: str, S: int, n_devices: int, block: int, repeats: int, timed: bool) -> dict:
    mp = mesh_plan(strategy, n_devices, block)
    args, dout, fwd, fwd_bwd = build(mp, S)
    t0 = time.perf_counter()
    c_fwd = fwd.lower(*args).compile()
    c_both = fwd_bwd.lower(*args, dout).compile()
    compile_s = time.perf_counter() - t0
    row = {
        "strategy": strategy if strategy != "usp" else f"usp {2}x{n_devices // 2}",
        "seq_len": S,
        "devices": n_devices,
        "context_degree": mp.context_degree,
        "fwd_temp_mib": c_fwd.memory_analysis().temp_size_in_bytes / MIB,
        "fwd_bwd_temp_mib": c_both.memory_analysis().temp_size_in_bytes / MIB,
        "fwd_bwd_args_mib": c_both.memory_analysis().argument_size_in_bytes / MIB,
        "compile_s": compile_s,
        "fwd_bwd_s": float("nan"),
    }
    if timed:
        q, k, v, pos, seg, do = concrete(mp, S, mp.context_degree)
        jax.block_until_ready(c_both(q, k, v, pos, seg, do))  # warm-up
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(c_both(q, k, v, pos, seg, do))
            times.append(time.perf_counter() - t)
        row["fwd_bwd_s"] = statistics.median(times)
    print(
        f"{row['strategy']:>10} S={S:>6} P={row['context_degree']}: fwd {row['fwd_temp_mib']:.1f} MiB, "
        f"fwd+bwd {row['fwd_bwd_temp_mib']:.1f} MiB, {row['fwd_bwd_s']:.2f} s (compile {compile_s:.1f} s)",
        flush=True,
    )
    return row


def to_markdown(rows: list[dict], ring_rows: list[dict], args) -> str:
    def fmt_s(x):
        return "-" if x != x else f"{x:.2f}"  # NaN: not timed

    lines = [
        "# Context-parallel strategy benchmark",
        "",
        f"Generated by `{' '.join(['python experiments/bench_strategies.py', *sys.argv[1:]])}`.",
        f"8 simulated CPU devices on one host ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
        f"jax {jax.__version__}; B={B}, {N} heads (MHA), head_dim {H}, float32, causal mask, zigzag layout, "
        f"xla kernel with {args.block}-token blocks. USP is Ulysses 2 x ring 4.",
        "",
        "Memory is the compiled per-device temporary buffer size (`memory_analysis().temp_size_in_bytes`; "
        "inputs and outputs not included). Time is the median forward+backward wall time over "
        f"{args.repeats} runs after a warm-up; the simulated devices share the cores, so it measures total "
        "work, not parallel speed; `-` means compiled for memory only.",
        "",
        "| strategy | S (tokens) | fwd temp / device (MiB) | fwd+bwd temp / device (MiB) | fwd+bwd time (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['strategy']} | {r['seq_len']} | {r['fwd_temp_mib']:.1f} | {r['fwd_bwd_temp_mib']:.1f} | "
            f"{fmt_s(r['fwd_bwd_s'])} |"
        )
    lines += [
        "",
        f"## Ring attention memory vs ring size at S = {args.ring_seq}",
        "",
        "| devices P | tokens / device | fwd temp / device (MiB) | fwd+bwd temp / device (MiB) |",
        "|---:|---:|---:|---:|",
    ]
    for r in ring_rows:
        lines.append(
            f"| {r['devices']} | {r['seq_len'] // r['devices']} | {r['fwd_temp_mib']:.1f} | {r['fwd_bwd_temp_mib']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384], help="timed sequence lengths")
    ap.add_argument("--memory-only-seqs", type=int, nargs="*", default=[65536], help="compiled, not timed")
    ap.add_argument("--memory-only", action="store_true", help="time nothing")
    ap.add_argument("--ring-seq", type=int, default=16384, help="S for the ring P = 2, 4, 8 sweep")
    ap.add_argument("--strategies", nargs="+", default=["allgather", "a2a", "ring", "usp"])
    # 256 = the zigzag chunk S/(2P) at S=4096, P=8: tiles then never straddle two chunks, so causal
    # tile skipping works inside each ring step (512-token tiles took 2x the time on 2 cores)
    ap.add_argument("--block", type=int, default=256, help="kernel block_q = block_kv in tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--md", default="docs/strategy_benchmark.md")
    ap.add_argument("--csv", default="docs/strategy_benchmark.csv")
    args = ap.parse_args(argv)

    rows = []
    for S in [*args.seqs, *args.memory_only_seqs]:
        timed = not args.memory_only and S in args.seqs
        for strategy in args.strategies:
            rows.append(measure(strategy, S, 8, args.block, args.repeats, timed))
    ring_rows = [measure("ring", args.ring_seq, P, args.block, args.repeats, False) for P in (2, 4, 8)]

    os.makedirs(os.path.dirname(args.md) or ".", exist_ok=True)
    with open(args.md, "w") as f:
        f.write(to_markdown(rows, ring_rows, args))
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) + ["sweep"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "sweep": "strategies"})
        for r in ring_rows:
            w.writerow({**r, "sweep": "ring_degree"})
    print(f"wrote {args.md} and {args.csv}")


if __name__ == "__main__":
    main()
