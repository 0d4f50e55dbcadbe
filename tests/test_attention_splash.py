"""The ``splash`` kernel (Pallas splash attention, interpret mode on CPU) against the dense
float32 reference, alone and as the per-device kernel of every context-parallel strategy.

Pallas interpret mode is slow on 2 cores: shapes are tiny, blocks are the smallest splash allows
(128 tokens) and every case compiles once (forward over two K/V halves merged through the
logsumexp, backward per half with the GLOBAL out/lse -- the ring step pattern -- in one jit).
"""

import dataclasses
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernel_calls import kernel_backward, kernel_forward

from lcx.attention import Mask, XlaKernel, make_kernel, merge_partials, reference_attention
from lcx.attention.kernels import splash as splash_mod
from lcx.attention.kernels import splash_intervals
from lcx.attention.kernels.jax_splash import splash_internals
from lcx.attention.kernels.splash import SplashKernel
from lcx.attention.kernels.splash_intervals import _intervals
from lcx.sharding import apply_layout

sys.path.insert(0, str(Path(__file__).parent))
import test_attention_strategies as strategies  # noqa: E402  (shared strategy-matrix helpers)

FAST_COMPILE = {"xla_backend_optimization_level": 0}
OUT_TOL = 5e-5  # the same bounds as the xla kernel and strategy tests; never loosened
GRAD_TOL = 2e-4

MASKS = {
    "causal": Mask(),
    "causal_doc": Mask(document=True),
    "window": Mask(window=37),
    "full_doc_window": Mask(causal=False, document=True, window=29),
    "doc_window": Mask(document=True, window=50),
    "chunk_doc": Mask(document=True, chunk=48),
    "full_chunk": Mask(causal=False, chunk=100),
}
HEADS = {"mha": (4, 4), "gqa2": (4, 2), "mqa": (4, 1)}


def _inputs(B, T, S, N, K, H, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (B, T, N, H), jnp.float32)
    k = jax.random.normal(ks[1], (B, S, K, H), jnp.float32)
    v = jax.random.normal(ks[2], (B, S, K, H), jnp.float32)
    do = jax.random.normal(ks[3], (B, T, N, H), jnp.float32)
    return q, k, v, do


def _zigzag_documents(B, S, P, seed):
    """Packed documents (positions restarting at 0 per document, as lcx.data writes them),
    zigzag-laid-out for P devices: int32 ``[B, S]`` positions and segment ids."""
    rng = np.random.default_rng(seed)
    pos = np.zeros((B, S), np.int32)
    seg = np.zeros((B, S), np.int32)
    for b in range(B):
        cuts = np.sort(rng.choice(np.arange(5, S - 5), size=4, replace=False))
        for i, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, S])):
            seg[b, lo:hi] = i + 1
            pos[b, lo:hi] = np.arange(hi - lo)
    return apply_layout(pos, "zigzag", P, axis=1), apply_layout(seg, "zigzag", P, axis=1)


def _dense_lse(q, k, qp, kp, qs, ks, mask):
    B, T, N, H = q.shape
    K = k.shape[2]
    s = jnp.einsum("BTKGH,BSKH->BKGTS", q.reshape(B, T, K, N // K, H), k) / jnp.sqrt(jnp.float32(H))
    s = jnp.where(mask.visible(qp, kp, qs, ks)[:, None, None], s, -jnp.inf)
    return jnp.moveaxis(jax.scipy.special.logsumexp(s, axis=-1), 3, 1).reshape(B, T, N)


def _reference(mask, q, k, v, qp, kp, qs, ks, do):
    f = lambda q, k, v: reference_attention(
        q, k, v, mask=mask, positions=qp, segment_ids=qs, kv_positions=kp, kv_segment_ids=ks
    )
    out, vjp = jax.vjp(f, q, k, v)
    return out, vjp(do), _dense_lse(q, k, qp, kp, qs, ks, mask)


def _two_block_run(kern, mask, q, k, v, qp, kp, qs, ks, do):
    """What a 2-step ring does with one kernel: forward per K/V half merged via the logsumexp,
    then each half's backward with the GLOBAL out/lse; dq summed, dk/dv concatenated."""
    h = k.shape[1] // 2
    halves = [(k[:, s], v[:, s], kp[:, s], ks[:, s]) for s in (slice(0, h), slice(h, None))]
    fwd = jax.jit(lambda *a: kernel_forward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)
    bwd = jax.jit(lambda *a: kernel_backward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)
    parts = [fwd(q, kb, vb, qp, kpb, qs, ksb) for kb, vb, kpb, ksb in halves]
    out, lse = merge_partials(*parts[0], *parts[1])
    grads = [bwd(q, kb, vb, qp, kpb, qs, ksb, out, lse, do) for kb, vb, kpb, ksb in halves]
    dq = grads[0][0] + grads[1][0]
    dk = jnp.concatenate([grads[0][1], grads[1][1]], axis=1)
    dv = jnp.concatenate([grads[0][2], grads[1][2]], axis=1)
    return out, lse, (dq, dk, dv)


def _assert_matches(out, lse, grads, ref_out, ref_grads, ref_lse):
    np.testing.assert_allclose(out, ref_out, atol=OUT_TOL, rtol=0)
    assert bool(jnp.all(jnp.isneginf(lse) == jnp.isneginf(ref_lse)))
    fin = jnp.isfinite(ref_lse)
    np.testing.assert_allclose(jnp.where(fin, lse, 0), jnp.where(fin, ref_lse, 0), atol=OUT_TOL, rtol=0)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(g)))
        np.testing.assert_allclose(g, r, atol=GRAD_TOL, rtol=0)


# Every mask once, every head layout at least once (each case ~8 s of interpret-mode compile).
KERNEL_CASES = [
    ("causal", "mha"),
    ("causal_doc", "gqa2"),
    ("window", "mqa"),
    ("full_doc_window", "gqa2"),
    ("doc_window", "mha"),
    ("chunk_doc", "gqa2"),
    ("full_chunk", "mqa"),
]


@pytest.mark.slow
@pytest.mark.parametrize("mask_name,heads", KERNEL_CASES, ids=[f"{m}-{h}" for m, h in KERNEL_CASES])
def test_splash_matches_reference_on_zigzag_positions(mask_name, heads):
    """Queries: device 0's zigzag shard (chunks 0 and 3 of 4) of a packed, zigzag-laid-out
    sequence; keys: the whole laid-out sequence, taken as two ring-step halves. Forward (out,
    lse) and per-block backward with the global lse, against the dense reference."""
    mask = MASKS[mask_name]
    N, K = HEADS[heads]
    B, S, H, P = 1, 512, 16, 2
    T = S // P
    q, k, v, do = _inputs(B, T, S, N, K, H, seed=len(mask_name))
    pos, seg = _zigzag_documents(B, S, P, seed=len(mask_name))
    if not mask.document:  # one long document: positions are the (zigzagged) global indices
        pos, seg = apply_layout(np.broadcast_to(np.arange(S, dtype=np.int32), (B, S)), "zigzag", P, axis=1), seg * 0
    qp, qs, kp, ks = (jnp.asarray(x) for x in (pos[:, :T], seg[:, :T], pos, seg))
    out, lse, grads = _two_block_run(SplashKernel(block_q=128, block_kv=128), mask, q, k, v, qp, kp, qs, ks, do)
    _assert_matches(out, lse, grads, *_reference(mask, q, k, v, qp, kp, qs, ks, do))


@pytest.mark.slow
def test_splash_pads_odd_lengths_chunks_long_kv_and_handles_empty_rows(monkeypatch):
    """Lengths that are not multiples of 128 (padded with invisible tokens), K/V longer than one
    splash call (forced here by lowering MAX_KV_CHUNK to 128: 3 chunks merged through the lse),
    unsorted key positions, and queries that see no key at all (out 0, lse -inf, grads 0)."""
    # the tiling reads the cap in splash_intervals (patching splash_mod would not split K/V)
    monkeypatch.setattr(splash_intervals, "MAX_KV_CHUNK", 128)
    assert splash_intervals._Plan(40, 300, 128, 128).n_chunks == 3
    mask = Mask(document=True)
    B, T, S, N, K, H = 2, 40, 300, 4, 2, 8
    q, k, v, do = _inputs(B, T, S, N, K, H, seed=5)
    rng = np.random.default_rng(5)
    kp = np.stack([rng.permutation(S) for _ in range(B)]).astype(np.int32)
    ks = (rng.random((B, S)) < 0.5).astype(np.int32)
    qp = rng.integers(-20, S, size=(B, T)).astype(np.int32)  # negative positions see no key
    qs = (rng.random((B, T)) < 0.5).astype(np.int32)
    qp, kp, qs, ks = (jnp.asarray(x) for x in (qp, kp, qs, ks))
    kern = SplashKernel(block_q=128, block_kv=128)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(q, k, v, qp, kp, qs, ks, do):
        out, lse = kernel_forward(kern, q, k, v, qp, kp, qs, ks, mask=mask)
        return out, lse, kernel_backward(kern, q, k, v, qp, kp, qs, ks, out, lse, do, mask=mask)

    out, lse, grads = run(q, k, v, qp, kp, qs, ks, do)
    ref_out, ref_grads, ref_lse = _reference(mask, q, k, v, qp, kp, qs, ks, do)
    empty = jnp.isneginf(ref_lse)
    assert bool(empty.any()) and bool((~empty).any())
    assert bool(jnp.all(jnp.where(empty[..., None], out, 0) == 0))
    _assert_matches(out, lse, grads, ref_out, ref_grads, ref_lse)


@pytest.mark.slow
@pytest.mark.parametrize("block_q", [32, 64])
def test_splash_query_blocks_below_128_match_reference(monkeypatch, block_q):
    """Query blocks that are multiples of 8 but not of 128 (what splash's forward kernel tiles
    by; commit 37f8d75 refused them): a sliding window on zigzag-permuted packed positions with
    a padded tail (segment id -1), two ring-step K/V halves, against the dense reference. The
    forward runs ``block_q``-query blocks, the dQ and dK/dV kernels 128-query ones."""
    seen = _record_bwd_blocks(monkeypatch)
    mask = Mask(window=37)
    B, S, N, K, H, P = 1, 256, 2, 1, 16, 2
    T = S // P
    q, k, v, do = _inputs(B, T, S, N, K, H, seed=block_q)
    pos, seg = _zigzag_documents(B, S, 1, seed=block_q)
    seg[:, S - 45 :] = -1  # the padded tail of a packed row, before the layout
    pos, seg = (apply_layout(x, "zigzag", P, axis=1) for x in (pos, seg))
    qp, qs, kp, ks = (jnp.asarray(x) for x in (pos[:, :T], seg[:, :T], pos, seg))
    out, lse, grads = _two_block_run(SplashKernel(block_q=block_q, block_kv=128), mask, q, k, v, qp, kp, qs, ks, do)
    ref = _reference(mask, q, k, v, qp, kp, qs, ks, do)
    _assert_matches(out, lse, grads, *ref)
    padq = np.asarray(qs) < 0
    assert padq.any() and bool(jnp.all(out[padq] == 0)) and bool(jnp.all(jnp.isneginf(lse[padq])))
    assert seen == {"dq": {(128, 128)}, "dkv": {(128, 128)}}


def _record_bwd_blocks(monkeypatch):
    """Wrap splash's two backward kernels to record the ``(bq, bkv)`` each is called with."""
    sp = splash_internals()
    seen = {"dq": set(), "dkv": set()}

    def recording(inner, key):
        def wrapped(*a, **kw):
            seen[key].add((kw["bq"], kw["bkv"]))
            return inner(*a, **kw)

        return wrapped

    wrapped = dataclasses.replace(sp, bwd_dq=recording(sp.bwd_dq, "dq"), bwd_dkv=recording(sp.bwd_dkv, "dkv"))
    monkeypatch.setattr(splash_mod, "splash_internals", lambda: wrapped)
    return seen


@pytest.mark.slow
def test_splash_backward_blocks_tile_the_dkv_kernel(monkeypatch):
    """block_q_dkv / block_kv_dkv (splash's BlockSizes names) tile splash's dK/dV kernel with
    its own block-sparsity grid, the dQ kernel keeps the forward's blocks, and the gradients
    equal the reference's: on zigzag positions (ring-step halves), and on odd lengths cut into
    several kv chunks (MAX_KV_CHUNK lowered to 256: two chunks of two 128-key dkv blocks)."""
    seen = _record_bwd_blocks(monkeypatch)
    mask = MASKS["causal_doc"]
    N, K = HEADS["gqa2"]
    B, S, H, P = 1, 512, 16, 2
    T = S // P
    q, k, v, do = _inputs(B, T, S, N, K, H, seed=21)
    pos, seg = _zigzag_documents(B, S, P, seed=21)
    qp, qs, kp, ks = (jnp.asarray(x) for x in (pos[:, :T], seg[:, :T], pos, seg))
    kern = SplashKernel(block_q=256, block_kv=256, block_q_dkv=128, block_kv_dkv=128)
    out, lse, grads = _two_block_run(kern, mask, q, k, v, qp, kp, qs, ks, do)
    _assert_matches(out, lse, grads, *_reference(mask, q, k, v, qp, kp, qs, ks, do))
    assert seen == {"dq": {(256, 256)}, "dkv": {(128, 128)}}

    monkeypatch.setattr(splash_intervals, "MAX_KV_CHUNK", 256)
    seen["dq"].clear(), seen["dkv"].clear()
    B, T, S, N, K, H = 1, 40, 300, 4, 2, 8
    q, k, v, do = _inputs(B, T, S, N, K, H, seed=22)
    rng = np.random.default_rng(22)
    kp = jnp.asarray(rng.permutation(S)[None], jnp.int32)
    ks = jnp.asarray(rng.random((B, S)) < 0.5, jnp.int32)
    qp = jnp.asarray(rng.integers(-20, S, size=(B, T)), jnp.int32)
    qs = jnp.asarray(rng.random((B, T)) < 0.5, jnp.int32)
    kern = SplashKernel(block_q=256, block_kv=256, block_q_dkv=128, block_kv_dkv=128)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(q, k, v, qp, kp, qs, ks, do):
        out, lse = kernel_forward(kern, q, k, v, qp, kp, qs, ks, mask=mask)
        return out, lse, kernel_backward(kern, q, k, v, qp, kp, qs, ks, out, lse, do, mask=mask)

    _assert_matches(*run(q, k, v, qp, kp, qs, ks, do), *_reference(mask, q, k, v, qp, kp, qs, ks, do))
    # 40 queries: one 128-query block for both; kv: 256-key forward blocks, 128-key dkv blocks
    assert seen == {"dq": {(128, 256)}, "dkv": {(128, 128)}}


def test_intervals_equal_the_mask_predicate():
    """The core claim, checked without Pallas: after sorting keys by (segment, position), the
    keys each query sees are exactly the index range [lo, hi) -- for every mask kind, with
    duplicate positions, restarting documents and arbitrary query positions."""
    rng = np.random.default_rng(0)
    T, S = 50, 70
    masks = [
        Mask(causal=c, document=d, window=w, chunk=n)
        for c in (True, False)
        for d in (True, False)
        for w, n in ((None, None), (1, None), (9, None), (None, 1), (None, 7), (None, 16))
    ]
    for trial in range(3):
        kp = rng.integers(-5, 30, size=S).astype(np.int32)
        ks = rng.integers(0, 4, size=S).astype(np.int32)
        qp = rng.integers(-10, 40, size=T).astype(np.int32)
        qs = rng.integers(0, 5, size=T).astype(np.int32)
        for mask in masks:
            order = np.lexsort((kp, ks)) if mask.document else np.argsort(kp, kind="stable")
            lo, hi = _intervals(
                mask, jnp.asarray(qp), jnp.asarray(qs), jnp.asarray(kp[order]), jnp.asarray(ks[order]), S
            )
            idx = np.arange(S)
            got = (idx[None, :] >= np.asarray(lo)[:, None]) & (idx[None, :] < np.asarray(hi)[:, None])
            want = np.asarray(
                mask.visible(jnp.asarray(qp), jnp.asarray(kp[order]), jnp.asarray(qs), jnp.asarray(ks[order]))
            )
            assert (got == want).all(), (trial, mask)


def test_block_sparsity_skips_hidden_kv_blocks():
    """Causal, contiguous: the on-device block mask is lower triangular (splash skips the rest)."""
    L, b = 512, 128
    pos = jnp.arange(L, dtype=jnp.int32)
    lo, hi = _intervals(Mask(), pos, pos * 0, pos, pos * 0, L)
    fwd, dkv = splash_mod._block_info(splash_internals(), lo, hi, b, b, L // b, jnp.zeros(L, bool))
    np.testing.assert_array_equal(fwd.block_mask[0], np.tril(np.ones((4, 4), np.int32)))
    assert fwd.q_sequence.shape == (L,) and fwd.q_sequence.dtype == jnp.int32


def test_splash_refuses_blocks_it_cannot_tile():
    # the forward's query block: multiples of 8 (sublanes); every other block: of 128 (lanes)
    for bq, bkv, what, unit in (
        (60, 128, "block_q", 8),
        (4, 128, "block_q", 8),
        (128, 200, "block_kv", 128),
        (64, 64, "block_kv", 128),
    ):
        with pytest.raises(ValueError, match=f"{what} to be a positive multiple of {unit} tokens"):
            make_kernel("splash", bq, bkv)
    # a block below 1 token is refused by BlockSizes itself, for every kernel, before splash's rules
    with pytest.raises(ValueError, match=r"plan\.attention\.block_q must be >= 1 token, got 0"):
        make_kernel("splash", 0, 128)
    for bq in (8, 32, 64, 200):
        assert make_kernel("splash", bq, 128).blocks.block_q == bq
    with pytest.raises(ValueError, match="block_kv <= 16384"):
        make_kernel("splash", 128, 32768)
    # the backward's blocks, by their own names
    with pytest.raises(ValueError, match="block_q_dkv to be a positive multiple of 128 tokens.*got 64"):
        make_kernel("splash", 128, 128, 64, None)
    with pytest.raises(ValueError, match="block_kv_dkv to be a positive multiple of 128 tokens.*got 64"):
        make_kernel("splash", 128, 128, None, 64)
    with pytest.raises(ValueError, match=r"block_kv_dkv must be >= 1 token .*got 0"):
        make_kernel("splash", 128, 128, None, 0)
    with pytest.raises(ValueError, match="block_kv_dkv <= 16384"):
        make_kernel("splash", 128, 128, None, 32768)
    with pytest.raises(ValueError, match="least common multiple 49152 exceeds 16384"):
        make_kernel("splash", 128, 16384, None, 384)
    assert make_kernel("splash", 1024, 2048, 512, 1024).blocks.block_kv_dkv == 1024
    assert isinstance(make_kernel("splash", 1024, 2048), SplashKernel)


def test_splash_and_xla_kernels_agree_with_bf16_inputs():
    """bf16 q/k/v (as on TPU): splash and xla agree within bf16 rounding of the inputs; the
    interface's float32 out/lse/grads come back float32."""
    mask = Mask(document=True)
    B, T, N, K, H = 1, 128, 4, 2, 16
    q, k, v, do = _inputs(B, T, T, N, K, H, seed=9)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    pos, seg = _zigzag_documents(B, T, 1, seed=9)
    pos, seg = jnp.asarray(pos), jnp.asarray(seg)
    res = []
    for kern in (SplashKernel(block_q=128, block_kv=128), XlaKernel(block_q=64, block_kv=64)):
        out, lse = jax.jit(lambda *a: kernel_forward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)(
            q, k, v, pos, pos, seg, seg
        )
        assert out.dtype == lse.dtype == jnp.float32
        res.append(out)
    np.testing.assert_allclose(res[0], res[1], atol=2e-2, rtol=0)


# --------------------------------------------------------------------------------------------
# Every strategy of the context-parallel matrix with kernel=splash, on a subset that fits CI:
# each strategy once, every mask kind and head layout at least once, both sequence layouts per
# case (one compilation), the strategy tests' shapes and tolerances.
STRATEGY_CASES = [
    ("ring", "causal_doc", "gqa4", 4),
    ("allgather", "window", "mqa", 2),
    ("a2a", "causal", "mha", 2),
    ("usp", "full", "gqa4", 2),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,mask_name,heads,degree", STRATEGY_CASES, ids=[f"{s}-{m}-{h}-{d}" for s, m, h, d in STRATEGY_CASES]
)
def test_strategy_with_splash_matches_reference(monkeypatch, strategy, mask_name, heads, degree):
    monkeypatch.setattr(strategies, "BLOCK_Q", 128)
    monkeypatch.setattr(strategies, "BLOCK_KV", 128)
    mp = strategies.make_mesh_plan(strategy, degree, kernel="splash")
    assert isinstance(mp.plan.attention.kernel, str) and mp.plan.attention.kernel == "splash"
    strategies.check_against_reference(mp, mask_name, heads)
