"""lcx context-parallel attention beside the public JAX ring-attention package, in ONE run.

On 8 simulated CPU devices, B=1, 8 query heads, head_dim 64, float32, causal, the sequence split
8 ways, for S in ``--seqs`` (default 4096 and 16384, plus GQA 8:2 at 4096) this measures, for
every lcx strategy (ring, usp 2x4, allgather, a2a; zigzag layout, xla kernel) and for
``ringattention`` (haoliuhl/RingAttention on PyPI: its jax ring attention under ``shard_map``,
contiguous layout, at each chunk size of ``--peer-chunks`` (S <= 4096; 128, 256, 512) and
``--peer-chunks-long`` (longer S; 256, its best when measured on this machine class), the best one used in the
targets):

- forward and forward+backward wall time: median of ``--repeats`` (>= 5) runs after a warm-up,
  compile time reported apart;
- useful FLOP/s: causal-halved ``4 B S^2 N H / 2`` for the forward and 3.5x that for
  forward+backward (MaxText's count; recomputation is not counted);
- per-device temporary memory of the compiled forward and forward+backward
  (``memory_analysis().temp_size_in_bytes``);
- max abs error of the output and of dq/dk/dv against a single-device float32 dense reference
  (``lcx.attention.reference_attention`` applied one query chunk at a time, rows being
  independent, with ``jax.checkpoint`` so its gradient fits in memory);

plus this machine's float32 GEMM throughput (a 4096^3 matmul, median of 5) in the same process,
and lcx ring memory at P = 2, 4, 8 for a fixed S (``--ring-seq``). Every target of the issue is a
ratio of numbers from this one run, checked at the end of the markdown.

The 8 simulated devices share the machine's cores, so wall time measures total work, not
parallel speed; the zigzag layout's balance does not show here, block skipping
does. Other processes on the machine slow every row alike only if they are steady: run it on an
idle machine (``uptime``).

Dependencies: ``pip install -e '.[bench]'`` (installs ``ringattention`` and its flax).

    python experiments/bench_attention.py            # ~20-30 minutes on 2 idle cores
    python experiments/bench_attention.py --seqs 4096 --repeats 5 --no-gqa --ring-seq 4096  # quick

Writes ``--md`` (default docs/attention_benchmark.md) and ``--csv``
(docs/attention_benchmark.csv).
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from lcx.attention import Mask, attention, reference_attention  # noqa: E402
from lcx.sharding import AttentionConfig, Plan, apply_layout, bind  # noqa: E402

B, N, H = 1, 8, 64
MIB = 2**20
CAUSAL = Mask()


def import_peer():
    """``ringattention`` 0.1.2 on jax >= 0.5: its ``__init__`` reads ``jax.lib.xla_bridge``,
    which no longer exists; alias it first. Returns its jax ring attention."""
    import jax.extend.backend

    if not hasattr(jax.lib, "xla_bridge"):
        jax.lib.xla_bridge = jax.extend.backend
    if not hasattr(jax.lib.xla_bridge, "get_backend"):
        jax.lib.xla_bridge.get_backend = jax.extend.backend.get_backend
    import ringattention

    return ringattention.ringattention_jax


def useful_flops(S: int, both: bool) -> float:
    f = 4 * B * S * S * N * H / 2
    return 3.5 * f if both else f


# ------------------------------------------------------------------------------------------
# inputs and reference


def make_inputs(S: int, K: int, seed: int = 0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (B, S, N, H), jnp.float32)
    k = jax.random.normal(ks[1], (B, S, K, H), jnp.float32)
    v = jax.random.normal(ks[2], (B, S, K, H), jnp.float32)
    do = jax.random.normal(ks[3], (B, S, N, H), jnp.float32)
    return q, k, v, do


def reference(q, k, v, do, chunk: int = 512):
    """Single-device float32 dense reference: out, (dq, dk, dv) in natural order. Query rows
    are independent, so the dense reference runs one query chunk at a time (checkpointed: its
    backward recomputes the chunk's probabilities instead of storing S x S of them)."""
    S = q.shape[1]
    pos = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    seg = jnp.zeros((B, S), jnp.int32)
    dev = jax.devices()[0]
    q, k, v, do = (jax.device_put(x, dev) for x in (q, k, v, do))

    def f(q, k, v):
        qc = jnp.moveaxis(q.reshape(B, S // chunk, chunk, N, H), 1, 0)
        pc = jnp.moveaxis(pos.reshape(B, S // chunk, chunk), 1, 0)

        @jax.checkpoint
        def one(args):
            qi, pi = args
            return reference_attention(
                qi, k, v, mask=CAUSAL, positions=pi, segment_ids=seg[:, :chunk], kv_positions=pos, kv_segment_ids=seg
            )

        out = jax.lax.map(one, (qc, pc))
        return jnp.moveaxis(out, 0, 1).reshape(B, S, N, H)

    @jax.jit
    def run(q, k, v, do):
        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(do)

    out, grads = run(q, k, v, do)
    return np.asarray(out), [np.asarray(g) for g in grads]


def max_errors(out, grads, ref_out, ref_grads, layout_fn):
    e_out = float(np.abs(np.asarray(out) - layout_fn(ref_out)).max())
    e_grad = max(float(np.abs(np.asarray(g) - layout_fn(r)).max()) for g, r in zip(grads, ref_grads))
    return e_out, e_grad


# ------------------------------------------------------------------------------------------
# contenders: each gives (mesh-sharded inputs, fwd fn, fwd+bwd fn, layout fn)


def lcx_plan(
    strategy: str, n_devices: int, block: int, block_q_dkv: int | None = None, block_kv_dkv: int | None = None
):
    """The bound plan of an lcx contender: ``block``-token forward blocks, the backward's
    ``block_q_dkv`` x ``block_kv_dkv`` (None: ``block``)."""
    if strategy == "usp":
        mesh, seq, batch = (("ulysses", 2), ("ring", n_devices // 2)), ("ulysses", "ring"), None
    else:
        mesh, seq, batch = (("data", 1), ("context", n_devices)), "context", "data"
    plan = Plan(
        mesh=mesh,
        activations={"batch": batch, "seq": seq},
        attention=AttentionConfig(
            strategy=strategy,
            layout="zigzag",
            block_q=block,
            block_kv=block,
            block_q_dkv=block_q_dkv,
            block_kv_dkv=block_kv_dkv,
        ),
    )
    return bind(plan, jax.devices()[:n_devices])


def lcx_contender(
    strategy: str, n_devices: int, block: int, S: int, block_q_dkv: int | None = None, block_kv_dkv: int | None = None
):
    mp = lcx_plan(strategy, n_devices, block, block_q_dkv, block_kv_dkv)
    Pd = mp.context_degree
    qs = mp.activation_sharding(("batch", "seq", "heads", "head_dim"))
    ps = mp.activation_sharding(("batch", "seq"))
    lay = functools.partial(apply_layout, layout="zigzag", degree=Pd, axis=1)
    pos = jax.device_put(lay(np.broadcast_to(np.arange(S, dtype=np.int32), (B, S))), ps)
    seg = jax.device_put(np.zeros((B, S), np.int32), ps)

    def fwd(q, k, v):
        return attention(q, k, v, plan=mp, mask=CAUSAL, positions=pos, segment_ids=seg)

    def both(q, k, v, do):
        out, vjp = jax.vjp(fwd, q, k, v)
        return out, vjp(do)

    def place(q, k, v, do):
        return tuple(jax.device_put(lay(np.asarray(x)), qs) for x in (q, k, v, do))

    return place, jax.jit(fwd), jax.jit(both), lay


def peer_contender(n_devices: int, chunk: int, S: int, K: int):
    """haoliuhl's ring attention (contiguous layout: its causal mask comes from the device index)
    under shard_map; GQA by repeating K/V heads on each device (it has no native GQA)."""
    ring_attention = import_peer()
    mesh = jax.make_mesh(
        (n_devices,), ("sp",), devices=jax.devices()[:n_devices], axis_types=(jax.sharding.AxisType.Auto,)
    )
    spec = P(None, "sp", None, None)
    sh = NamedSharding(mesh, spec)
    kwargs = dict(
        causal_block_size=1,
        query_chunk_size=chunk,
        key_chunk_size=chunk,
        deterministic=True,
        dropout_rng=None,
        attn_pdrop=0.0,
        dtype=jnp.float32,
        policy=jax.checkpoint_policies.nothing_saveable,
        precision=None,
        prevent_cse=True,
    )

    def local(q, k, v):
        if K != N:
            k, v = (jnp.repeat(x, N // K, axis=2) for x in (k, v))
        return ring_attention(q, k, v, None, None, None, "sp", True, kwargs)

    fwd = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)

    def both(q, k, v, do):
        out, vjp = jax.vjp(fwd, q, k, v)
        return out, vjp(do)

    def place(q, k, v, do):
        return tuple(jax.device_put(x, sh) for x in (q, k, v, do))

    return place, jax.jit(fwd), jax.jit(both), lambda x: x


# ------------------------------------------------------------------------------------------
# measurement


def timed(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # warm-up
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _once(fn, args) -> float:
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t


def measure_all(named, S, K, inputs, ref, repeats, gemm):
    """Compile every contender of one configuration, then time them INTERLEAVED: each round runs
    every contender's forward and forward+backward once, ``repeats`` rounds after a warm-up
    round. On a machine shared with other jobs the load then drifts over all contenders alike,
    so their ratios stay fair; each time is the median of its ``repeats`` samples. The GEMM
    reference (``gemm``: a compiled matmul and its operands) runs in every round too."""
    prepared = []
    for name, make in named:
        place, fwd, both, lay = make()
        q, k, v, do = place(*inputs)
        t0 = time.perf_counter()
        c_fwd = fwd.lower(q, k, v).compile()
        c_both = both.lower(q, k, v, do).compile()
        prepared.append((name, c_fwd, c_both, (q, k, v), (q, k, v, do), lay, time.perf_counter() - t0))
    samples = {p[0]: ([], []) for p in prepared}
    gemm_t = []
    for r in range(repeats + 1):  # round 0 is the warm-up
        tg = _once(*gemm)
        if r:
            gemm_t.append(tg)
        for name, c_fwd, c_both, a_fwd, a_both, *_ in prepared:
            tf, tb = _once(c_fwd, a_fwd), _once(c_both, a_both)
            if r:
                samples[name][0].append(tf)
                samples[name][1].append(tb)
        print(f"  round {r}/{repeats} done", flush=True)
    rows = []
    gemm_gf = 2 * gemm[1][0].shape[0] ** 3 / statistics.median(gemm_t) / 1e9
    for name, c_fwd, c_both, _a_fwd, a_both, lay, compile_s in prepared:
        t_fwd, t_both = (statistics.median(x) for x in samples[name])
        out, grads = c_both(*a_both)
        e_out, e_grad = max_errors(out, grads, *ref, lay)
        row = {
            "contender": name,
            "seq_len": S,
            "q_heads": N,
            "kv_heads": K,
            "devices": 8,
            "fwd_s": t_fwd,
            "fwd_bwd_s": t_both,
            "fwd_gflops": useful_flops(S, False) / t_fwd / 1e9,
            "fwd_bwd_gflops": useful_flops(S, True) / t_both / 1e9,
            "fwd_temp_mib": c_fwd.memory_analysis().temp_size_in_bytes / MIB,
            "fwd_bwd_temp_mib": c_both.memory_analysis().temp_size_in_bytes / MIB,
            "max_err_out": e_out,
            "max_err_grad": e_grad,
            "compile_s": compile_s,
            "gemm_gflops": gemm_gf,
        }
        print(
            f"{name:>24} S={S:>6} K={K}: fwd {t_fwd:7.3f} s, fwd+bwd {t_both:7.3f} s "
            f"({row['fwd_bwd_gflops']:5.1f} GFLOP/s), temp {row['fwd_temp_mib']:6.1f} / {row['fwd_bwd_temp_mib']:6.1f} MiB, "
            f"err {e_out:.1e} / {e_grad:.1e}, compile {compile_s:.1f} s",
            flush=True,
        )
        rows.append(row)
    return rows


def gemm_op(n: int = 4096):
    """A compiled float32 ``n^3`` matmul and its operands (this machine's GEMM roofline)."""
    a = jax.device_put(jax.random.normal(jax.random.key(1), (n, n), jnp.float32), jax.devices()[0])
    return jax.jit(lambda a, b: a @ b).lower(a, a).compile(), (a, a)


def gemm_gflops(n: int = 4096, repeats: int = 5) -> float:
    mm, args = gemm_op(n)
    return 2 * n**3 / timed(mm, args, repeats) / 1e9


def ring_memory(S: int, block: int, block_q_dkv: int | None = None, block_kv_dkv: int | None = None) -> list[dict]:
    rows = []
    for Pd in (2, 4, 8):
        _, fwd, both, _ = lcx_contender("ring", Pd, block, S, block_q_dkv, block_kv_dkv)
        sharding = lcx_plan("ring", Pd, block).activation_sharding(("batch", "seq", "heads", "head_dim"))
        x = jax.ShapeDtypeStruct((B, S, N, H), jnp.float32, sharding=sharding)
        cf, cb = fwd.lower(x, x, x).compile(), both.lower(x, x, x, x).compile()
        rows.append(
            {
                "devices": Pd,
                "seq_len": S,
                "fwd_temp_mib": cf.memory_analysis().temp_size_in_bytes / MIB,
                "fwd_bwd_temp_mib": cb.memory_analysis().temp_size_in_bytes / MIB,
            }
        )
        print(
            f"ring P={Pd} S={S}: temp {rows[-1]['fwd_temp_mib']:.1f} / {rows[-1]['fwd_bwd_temp_mib']:.1f} MiB",
            flush=True,
        )
    return rows


# ------------------------------------------------------------------------------------------
# report


def targets(rows, ring_rows, gemm, seqs):
    """The issue's targets as (text, value, holds) from this run's numbers."""

    def get(name, S, K=N):
        for r in rows:
            if r["contender"] == name and r["seq_len"] == S and r["kv_heads"] == K:
                return r
        return None

    def peer_best(S, K=N):
        cands = [
            r for r in rows if r["contender"].startswith("ringattention") and r["seq_len"] == S and r["kv_heads"] == K
        ]
        return min(cands, key=lambda r: r["fwd_bwd_s"]) if cands else None

    out = []
    Sbig = max(seqs)
    ring, peer = get("lcx ring", Sbig), peer_best(Sbig)
    if ring and peer:
        sp = peer["fwd_bwd_s"] / ring["fwd_bwd_s"]
        out.append(
            (
                f"ring fwd+bwd at S={Sbig} >= 1.5x faster than the peer's best ({peer['contender']})",
                f"{sp:.2f}x",
                sp >= 1.5,
            )
        )
        g = ring.get("gemm_gflops", gemm)
        frac = ring["fwd_bwd_gflops"] / g
        out.append(
            (
                f"ring fwd+bwd at S={Sbig} >= 50% of GEMM throughput ({g:.0f} GFLOP/s, timed in the same rounds)",
                f"{100 * frac:.0f}% ({ring['fwd_bwd_gflops']:.1f} GFLOP/s)",
                frac >= 0.5,
            )
        )
        mr = ring["fwd_bwd_temp_mib"] / peer["fwd_bwd_temp_mib"]
        out.append(
            (
                f"ring fwd+bwd temp / device at S={Sbig} <= 0.5x the peer's",
                f"{ring['fwd_bwd_temp_mib']:.1f} vs {peer['fwd_bwd_temp_mib']:.1f} MiB ({mr:.2f}x)",
                mr <= 0.5,
            )
        )
    if ring_rows:
        m = {r["devices"]: r["fwd_bwd_temp_mib"] for r in ring_rows}
        ok = all(m[p] <= 1.15 * m[2] * 2 / p for p in (4, 8))
        out.append(
            (
                f"ring fwd+bwd temp falls as 1/P (P=2,4,8 at S={ring_rows[0]['seq_len']}; within 15%)",
                " / ".join(f"{m[p]:.1f}" for p in (2, 4, 8))
                + f" MiB (ideal {m[2]:.1f} / {m[2] / 2:.1f} / {m[2] / 4:.1f})",
                ok,
            )
        )
    Ssmall = min(seqs)
    r = get("lcx ring", Ssmall)
    for name in ("lcx usp 2x4", "lcx allgather"):
        x = get(name, Ssmall)
        if r and x:
            ratio = x["fwd_bwd_s"] / r["fwd_bwd_s"]
            out.append((f"{name} fwd+bwd at S={Ssmall} within 1.3x of lcx ring", f"{ratio:.2f}x", ratio <= 1.3))
    a2a, ag = get("lcx a2a", Ssmall), get("lcx allgather", Ssmall)
    if a2a and ag:
        ratio = a2a["fwd_bwd_s"] / ag["fwd_bwd_s"]
        out.append((f"lcx a2a no slower than all-gather at S={Ssmall} (fwd+bwd)", f"{ratio:.2f}x", ratio <= 1.0))
    return out


def to_markdown(rows, ring_rows, gemm, tgt, args, load) -> str:
    cmd = " ".join(["python experiments/bench_attention.py", *sys.argv[1:]])
    group_gemms = ", ".join(dict.fromkeys(f"{r['gemm_gflops']:.0f}" for r in rows))
    lines = [
        "# Context-parallel attention: lcx vs the public JAX ring-attention package",
        "",
        f'Generated by `{cmd}` (one process, one run), after `pip install -e ".[bench]"` (the peer package).',
        f"8 simulated CPU devices on one host ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
        f"jax {jax.__version__}; B={B}, {N} query heads, head_dim {H}, float32, causal mask, sequence split 8 ways. "
        f"lcx: zigzag layout, xla kernel, {_blocks_caption(args)}; USP is Ulysses 2 x ring 4. Peer: "
        "`ringattention` 0.1.2 (PyPI, haoliuhl/RingAttention), its jax ring attention under `shard_map`, contiguous "
        "layout, token-causal (`causal_block_size=1`), K/V heads repeated for GQA; every chunk size tried is listed.",
        f"Machine float32 GEMM (4096^3 matmul, same process): {gemm:.0f} GFLOP/s at the start; it is also timed in "
        "every round of every row group, and % GEMM compares each row with the GEMM median of its own group "
        f"({group_gemms} GFLOP/s). "
        f"Load average at start / end: {load[0]} / {load[1]}.",
        "",
        f"Times are medians of {args.repeats} runs after a warm-up (compile time apart), the contenders of a row group "
        "timed interleaved (round robin) so that load from other jobs on the machine falls on all of them alike. Useful FLOPs: causal-halved "
        "4·B·S²·N·H/2 forward, 3.5x that forward+backward. Memory: compiled per-device temporary buffers "
        "(`memory_analysis().temp_size_in_bytes`; inputs/outputs excluded). Errors: max |x - ref| against a "
        "single-device float32 dense reference (output; worst of dq/dk/dv). The simulated devices share the cores, "
        "so wall time is total work.",
        "",
        "| contender | S | q:kv heads | fwd (s) | fwd+bwd (s) | fwd GFLOP/s | fwd+bwd GFLOP/s | % GEMM | "
        "fwd temp (MiB) | fwd+bwd temp (MiB) | err out | err grad | compile (s) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['contender']} | {r['seq_len']} | {r['q_heads']}:{r['kv_heads']} | {r['fwd_s']:.3f} | "
            f"{r['fwd_bwd_s']:.3f} | {r['fwd_gflops']:.1f} | {r['fwd_bwd_gflops']:.1f} | "
            f"{100 * r['fwd_bwd_gflops'] / r['gemm_gflops']:.0f}% | {r['fwd_temp_mib']:.1f} | {r['fwd_bwd_temp_mib']:.1f} | "
            f"{r['max_err_out']:.1e} | {r['max_err_grad']:.1e} | {r['compile_s']:.1f} |"
        )
    if ring_rows:
        lines += [
            "",
            f"## lcx ring memory vs ring size P at S = {ring_rows[0]['seq_len']}",
            "",
            "| P | tokens / device | fwd temp (MiB) | fwd+bwd temp (MiB) |",
            "|---:|---:|---:|---:|",
        ]
        for r in ring_rows:
            lines.append(
                f"| {r['devices']} | {r['seq_len'] // r['devices']} | {r['fwd_temp_mib']:.1f} | "
                f"{r['fwd_bwd_temp_mib']:.1f} |"
            )
    lines += ["", "## Targets (ratios from this run)", "", "| target | measured | holds |", "|---|---|---|"]
    for text, val, ok in tgt:
        lines.append(f"| {text} | {val} | {'yes' if ok else '**no**'} |")
    return "\n".join(lines) + "\n"


def _blocks_caption(args) -> str:
    """The lcx kernel's blocks for the table caption, e.g. ``256-token blocks (backward 256 x
    128, q x kv)``."""
    bq = args.block if args.block_q_dkv is None else args.block_q_dkv
    bk = args.block if args.block_kv_dkv is None else args.block_kv_dkv
    same = (bq, bk) == (args.block, args.block)
    return f"{args.block}-token blocks" + ("" if same else f" (backward {bq} x {bk}, q x kv)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--no-gqa", action="store_true", help="skip the GQA 8:2 rows (at the smallest S)")
    ap.add_argument("--strategies", nargs="+", default=["ring", "usp", "allgather", "a2a"])
    ap.add_argument(
        "--block", type=int, default=256, help="lcx kernel block_q = block_kv (tokens; default %(default)s)"
    )
    ap.add_argument(
        "--block-q-dkv",
        type=int,
        default=None,
        help="lcx kernel backward query block, plan.attention.block_q_dkv (tokens; default --block)",
    )
    # the backward holds three [block_kv_dkv, G block_q_dkv] float32 tiles, the forward one:
    # half the key block there keeps the backward's cache footprint near the forward's and
    # shrinks the part of the ring's temp memory that does not fall with P (docs/strategies.md)
    ap.add_argument(
        "--block-kv-dkv",
        type=int,
        default=128,
        help="lcx kernel backward key/value block, plan.attention.block_kv_dkv (tokens; default "
        "%(default)s; 0: --block)",
    )
    ap.add_argument(
        "--peer-chunks",
        type=int,
        nargs="+",
        default=[128, 256, 512],
        help="ringattention query/key chunk sizes tried at S <= 4096 (best one used in the targets)",
    )
    # on this machine class 256 beat 512 and 1024 at S=16384; each try costs minutes
    ap.add_argument(
        "--peer-chunks-long", type=int, nargs="+", default=[256], help="ringattention chunk sizes tried at S > 4096"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ring-seq", type=int, default=16384, help="S of the lcx ring P = 2, 4, 8 memory sweep")
    ap.add_argument("--md", default="docs/attention_benchmark.md")
    ap.add_argument("--csv", default="docs/attention_benchmark.csv")
    args = ap.parse_args(argv)
    if args.block_kv_dkv == 0:  # the forward's key block
        args.block_kv_dkv = None
    if args.repeats < 5:
        print("note: fewer than 5 repeats; the issue asks for medians of >= 5", file=sys.stderr)

    load0 = " ".join(f"{x:.1f}" for x in os.getloadavg())
    gemm = gemm_gflops()
    print(f"float32 GEMM 4096^3: {gemm:.1f} GFLOP/s", flush=True)
    configs = [(S, N) for S in sorted(args.seqs)]
    if not args.no_gqa:
        configs.insert(1, (min(args.seqs), 2))
    rows = []
    # the compile-only P sweep first: it is cheap, and the long rows can then be watched as the
    # tables are rewritten after every row
    ring_rows = ring_memory(args.ring_seq, args.block, args.block_q_dkv, args.block_kv_dkv) if args.ring_seq else []

    def write():
        tgt = targets(rows, ring_rows, gemm, args.seqs)
        load1 = " ".join(f"{x:.1f}" for x in os.getloadavg())
        os.makedirs(os.path.dirname(args.md) or ".", exist_ok=True)
        with open(args.md, "w") as f:
            f.write(to_markdown(rows, ring_rows, gemm, tgt, args, (load0, load1)))
        with open(args.csv, "w", newline="") as f:
            keys = list(rows[0])
            w = csv.DictWriter(f, fieldnames=["sweep", *keys])
            w.writeheader()
            for r in rows:
                w.writerow({"sweep": "contenders", **r})
            for r in ring_rows:
                w.writerow({"sweep": "ring_degree", **r})
        return tgt

    for S, K in configs:
        inputs = make_inputs(S, K)
        t = time.perf_counter()
        ref = reference(*inputs)
        print(f"reference S={S} K={K}: {time.perf_counter() - t:.1f} s", flush=True)
        order = sorted(args.strategies, key=lambda s: s != "ring")
        chunks = args.peer_chunks if S <= 4096 else args.peer_chunks_long
        runs = [
            (
                f"lcx {st}" if st != "usp" else "lcx usp 2x4",
                functools.partial(lcx_contender, st, 8, args.block, S, args.block_q_dkv, args.block_kv_dkv),
            )
            for st in order
        ]
        runs[1:1] = [
            (f"ringattention chunk {c}", functools.partial(peer_contender, 8, c, S, K))
            for c in chunks
            if (S // 8) % c == 0
        ]
        rows.extend(measure_all(runs, S, K, inputs, ref, args.repeats, gemm_op()))
        write()
        del ref
    tgt = write()
    for text, val, ok in tgt:
        print(f"[{'ok' if ok else 'NO'}] {text}: {val}")
    print(f"wrote {args.md} and {args.csv}")


if __name__ == "__main__":
    main()
