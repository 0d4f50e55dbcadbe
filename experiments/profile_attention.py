"""Where lcx ring attention's time goes: kernel (matmuls vs the rest) vs merge vs transfer.

Ablations of the SAME work on 8 simulated CPU devices (B=1, 8 heads, head_dim 64, float32,
causal, zigzag), each timed as a median of ``--repeats`` runs after a warm-up, in one process:

1. ``ring``: the real ring, forward and forward+backward (:class:`lcx.attention.Ring`).
2. ``no transfer``: every device is handed, as a program input, the K/V shard it would hold at
   each ring step, then runs the same per-step kernel calls and logsumexp merges (forward), or
   the same per-step kernel backward calls and accumulations (backward) with no collective at all.
3. ``kernel only``: as 2 without the merges (the forward's per-step outputs are only summed, one
   cheap pass, so that nothing is dead code).
4. ``matmuls only``: exactly the GEMMs the kernel runs for the visible tiles (2 per tile forward,
   5 backward, same shapes, same count per device), nothing else.

So: transfer (+ ring bookkeeping) = 1 - 2; merge = 2 - 3; the kernel's softmax element-wise work,
masking and loop overhead = 3 - 4; matmuls = 4. Hops, tiles and sizes are printed alongside.

    python experiments/profile_attention.py --seq 16384 --block 512     # a few minutes
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from lcx.attention import Cotangent, KVBlock, Mask, QueryBlock, Ring, XlaKernel, merge_partials  # noqa: E402
from lcx.attention.kernels.xla import FULL, PARTIAL, block_size, tile_class  # noqa: E402
from lcx.attention.strategies.ring import heads_per_pass  # noqa: E402
from lcx.sharding import apply_layout  # noqa: E402

B, N, H, PD = 1, 8, 64, 8
MASK = Mask()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    S, Pd = args.seq, PD
    T = S // Pd
    kern = XlaKernel(args.block, args.block)
    mesh = jax.make_mesh((Pd,), ("c",), axis_types=(jax.sharding.AxisType.Auto,))
    spec, pspec, sspec = P(None, "c"), P(None, "c"), P(None, None, "c")  # sspec: [steps, B, S, ...]
    sh = lambda s: NamedSharding(mesh, s)
    lay = lambda x, axis=1: apply_layout(np.asarray(x), "zigzag", Pd, axis=axis)

    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (lay(jax.random.normal(kk, (B, S, N, H), jnp.float32)) for kk in ks)
    pos = lay(np.broadcast_to(np.arange(S, dtype=np.int32), (B, S)))
    seg = np.zeros((B, S), np.int32)
    kvh = heads_per_pass((B, T, N, H), jnp.float32)

    # K/V (and positions) each device holds at ring step s: the shard of device (i - s) mod P
    def per_step(x):
        shards = np.split(x, Pd, axis=1)
        return np.stack([np.concatenate([shards[(i - s) % Pd] for i in range(Pd)], axis=1) for s in range(Pd)])

    ks_, vs_, ps_ = per_step(k), per_step(v), per_step(pos)
    put = lambda x, s: jax.device_put(x, sh(s))
    qd, kd, vd, dod = (put(x, spec) for x in (q, k, v, do))
    posd, segd = put(pos, pspec), put(seg, pspec)
    ksd, vsd, psd = put(ks_, sspec), put(vs_, sspec), put(ps_, sspec)

    def smap(f, in_specs, out_specs):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))

    # 1. the ring
    ring_strategy = Ring(kernel=kern, mask=MASK, axes=("c",), degree=Pd)
    ring = lambda q, k, v, p, s: ring_strategy(QueryBlock(q, p, s), KVBlock(k, v, p, s))
    ring_f = smap(ring, (spec,) * 3 + (pspec,) * 2, spec)

    def ring_b(q, k, v, p, s, do):
        out, vjp = jax.vjp(lambda q, k, v: ring(q, k, v, p, s), q, k, v)
        return vjp(do)

    ring_fb = smap(ring_b, (spec,) * 3 + (pspec,) * 2 + (spec,), (spec,) * 3)

    # 2./3. the same kernel calls with K/V pre-placed (head passes as in the ring)
    def heads(x, i, n):
        return lax.dynamic_slice_in_dim(x, i * n, n, axis=2)

    def local_fwd(q, kss, vss, pss, p, s, merge):
        npass = N // kvh

        def one_pass(i, acc):
            qi = heads(q, i, kvh)
            o = jnp.zeros(qi.shape, jnp.float32)
            l = jnp.full(qi.shape[:3], -jnp.inf, jnp.float32)
            for st in range(Pd):
                kvb = KVBlock(heads(kss[st], i, kvh), heads(vss[st], i, kvh), pss[st], s)
                ob, lb = kern.forward(QueryBlock(qi, p, s), kvb, mask=MASK)
                o, l = merge_partials(o, l, ob, lb) if merge else (o + ob, l)
            return lax.dynamic_update_slice_in_dim(acc, o, i * kvh, axis=2)

        return lax.fori_loop(0, npass, one_pass, jnp.zeros(q.shape, jnp.float32))

    nt_f = smap(lambda *a: local_fwd(*a, True), (spec, sspec, sspec, sspec, pspec, pspec), spec)
    nk_f = smap(lambda *a: local_fwd(*a, False), (spec, sspec, sspec, sspec, pspec, pspec), spec)

    def local_bwd(q, kss, vss, pss, p, s, out, lse, do):
        npass = N // kvh

        def one_pass(i, acc):
            qi, oi, li, doi = heads(q, i, kvh), heads(out, i, kvh), heads(lse, i, kvh), heads(do, i, kvh)
            dq = jnp.zeros(qi.shape, jnp.float32)
            dks = []
            for st in range(Pd):
                kvb = KVBlock(heads(kss[st], i, kvh), heads(vss[st], i, kvh), pss[st], s)
                g = kern.backward(QueryBlock(qi, p, s), kvb, Cotangent.of(oi, li, doi), mask=MASK)
                dq = dq + g[0]
                dks.append(g[1] + g[2])
            return lax.dynamic_update_slice_in_dim(acc, dq + sum(dks), i * kvh, axis=2)

        return lax.fori_loop(0, npass, one_pass, jnp.zeros(q.shape, jnp.float32))

    # global out / lse for the backward-only program (from the no-transfer forward)
    def fwd_lse(q, kss, vss, pss, p, s):
        o = jnp.zeros(q.shape, jnp.float32)
        l = jnp.full(q.shape[:3], -jnp.inf, jnp.float32)
        for st in range(Pd):
            o, l = merge_partials(
                o, l, *kern.forward(QueryBlock(q, p, s), KVBlock(kss[st], vss[st], pss[st], s), mask=MASK)
            )
        return o, l

    out, lse = smap(fwd_lse, (spec, sspec, sspec, sspec, pspec, pspec), (spec, pspec))(qd, ksd, vsd, psd, posd, segd)
    nk_b = smap(local_bwd, (spec, sspec, sspec, sspec, pspec, pspec, spec, P(None, "c"), spec), spec)

    # 4. matmuls only: per device, the visible tiles' GEMMs (2 fwd, 5 bwd) at the same shapes
    bq = block_size(T, args.block)
    counts = np.zeros(3, int)
    for st in range(Pd):
        for dev in range(Pd):
            qp = pos[:, dev * T : (dev + 1) * T]
            kp = ps_[st][:, dev * T : (dev + 1) * T]
            for i in range(0, T, bq):
                for j in range(0, T, bq):
                    counts[int(tile_class(MASK, qp[:, i : i + bq], kp[:, j : j + bq], seg[:, :bq], seg[:, :bq]))] += 1
    tiles = int(counts[FULL] + counts[PARTIAL]) // Pd  # per device, all heads
    npass = N // kvh
    dn = (((3,), (3,)), ((0, 1), (0, 1)))
    nn = (((3,), (2,)), ((0, 1), (0, 1)))

    def gemms(a, bs, n_dots):
        # distinct right-hand sides, so that XLA cannot merge the products (CSE)
        def body(_, c):
            s = lax.dot_general(a + c[..., :1, :1], a, dn)  # [B, h, bq, bq]
            acc = c
            for d in range(n_dots - 1):
                acc = acc + lax.dot_general(s, bs[d], nn)
            return acc * 1e-3

        return lax.fori_loop(0, tiles * npass, body, jnp.zeros_like(a))

    bd = tuple(jax.device_put(jnp.full((Pd * B, kvh, bq, H), 0.1 * (d + 1), jnp.float32), sh(P("c"))) for d in range(4))
    mm_f = smap(lambda a, b0, b1, b2, b3: gemms(a, (b0, b1, b2, b3), 2), (P("c"),) * 5, P("c"))
    mm_b = smap(lambda a, b0, b1, b2, b3: gemms(a, (b0, b1, b2, b3), 5), (P("c"),) * 5, P("c"))
    ad = jax.device_put(jnp.ones((Pd * B, kvh, bq, H), jnp.float32), sh(P("c")))

    progs = {
        "ring fwd": (ring_f, (qd, kd, vd, posd, segd)),
        "no-transfer fwd (kernel + merge)": (nt_f, (qd, ksd, vsd, psd, posd, segd)),
        "kernel-only fwd": (nk_f, (qd, ksd, vsd, psd, posd, segd)),
        "matmuls-only fwd": (mm_f, (ad, *bd)),
        "ring fwd+bwd": (ring_fb, (qd, kd, vd, posd, segd, dod)),
        "kernel-only bwd": (nk_b, (qd, ksd, vsd, psd, posd, segd, out, lse, dod)),
        "matmuls-only bwd": (mm_b, (ad, *bd)),
    }
    # interleaved rounds (round 0 = warm-up): load from other jobs falls on every variant alike
    samples = {k_: [] for k_ in progs}
    for r in range(args.repeats + 1):
        for k_, (fn, a_) in progs.items():
            t = time.perf_counter()
            jax.block_until_ready(fn(*a_))
            if r:
                samples[k_].append(time.perf_counter() - t)
    res = {k_: statistics.median(v_) for k_, v_ in samples.items()}
    print(
        f"S={S} P={Pd} T={T} block={bq} kv heads per pass={kvh}; tiles per device per pass: "
        f"{tiles} visible ({counts[FULL] // Pd} full, {counts[PARTIAL] // Pd} partial, {counts[0] // Pd} hidden)"
    )
    for k_, t in res.items():
        print(f"{k_:>34}: {t:8.3f} s")
    ring_b_only = res["ring fwd+bwd"] - res["ring fwd"]
    print(f"{'ring bwd (fwd+bwd - fwd)':>34}: {ring_b_only:8.3f} s")
    print(
        f"forward : transfer+bookkeeping {res['ring fwd'] - res['no-transfer fwd (kernel + merge)']:.3f} s, "
        f"merge {res['no-transfer fwd (kernel + merge)'] - res['kernel-only fwd']:.3f} s, "
        f"softmax/mask/loops {res['kernel-only fwd'] - res['matmuls-only fwd']:.3f} s, "
        f"matmuls {res['matmuls-only fwd']:.3f} s"
    )
    print(
        f"backward: transfer+bookkeeping {ring_b_only - res['kernel-only bwd']:.3f} s, "
        f"softmax/mask/loops {res['kernel-only bwd'] - res['matmuls-only bwd']:.3f} s, "
        f"matmuls {res['matmuls-only bwd']:.3f} s"
    )


if __name__ == "__main__":
    main()
