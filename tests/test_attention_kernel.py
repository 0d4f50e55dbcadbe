"""The per-device kernel, local flash attention, mask block predicate and logsumexp merge.

Everything here is single-device float32 against lcx.attention.reference_attention (dense), or
against exact expected values where they exist.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernel_calls import kernel_backward, kernel_forward

from lcx.attention import (
    Mask,
    XlaKernel,
    flash_attention,
    make_kernel,
    merge_partials,
    reference_attention,
)
from lcx.attention.blocks import Cotangent, KVBlock, QueryBlock
from lcx.attention.kernels import AbstractComposedKernel, BlockSizes, block_size, output_delta

# XLA:CPU optimisation level 0 halves compile time at these tiny shapes; semantics unchanged.
FAST_COMPILE = {"xla_backend_optimization_level": 0}

OUT_TOL = 5e-5
GRAD_TOL = 2e-4

MASKS = {
    "causal": Mask(),
    "causal_doc": Mask(document=True),
    "window": Mask(window=7),
    "full": Mask(causal=False),
    "full_doc_window": Mask(causal=False, document=True, window=5),
    "chunk_doc": Mask(document=True, chunk=6),
}


def _inputs(B, T, S, N, K, H, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (B, T, N, H), jnp.float32)
    k = jax.random.normal(ks[1], (B, S, K, H), jnp.float32)
    v = jax.random.normal(ks[2], (B, S, K, H), jnp.float32)
    do = jax.random.normal(ks[3], (B, T, N, H), jnp.float32)
    return q, k, v, do


def _dense_lse(q, k, qp, kp, qs, ks, mask):
    """Dense logsumexp of scaled visible logits, [B, T, N]; -inf where nothing is visible."""
    B, T, N, H = q.shape
    K = k.shape[2]
    s = jnp.einsum("BTKGH,BSKH->BKGTS", q.reshape(B, T, K, N // K, H), k) / jnp.sqrt(jnp.float32(H))
    s = jnp.where(mask.visible(qp, kp, qs, ks)[:, None, None], s, -jnp.inf)
    lse = jax.scipy.special.logsumexp(s, axis=-1)  # [B, K, G, T]
    return jnp.moveaxis(lse, 3, 1).reshape(B, T, N)


def _value_and_vjp(f, ct, *args):
    out, vjp = jax.vjp(f, *args)
    return out, vjp(ct)


def _cross_positions(B, T, S, seed=1):
    """Query and key positions/segments that differ (cross attention over a shifted window),
    with a few queries that see no key at all under a causal mask."""
    rng = np.random.default_rng(seed)
    kp = np.broadcast_to(np.arange(S), (B, S)).astype(np.int32)
    qp = np.sort(rng.integers(-3, S + 3, size=(B, T)), axis=1).astype(np.int32)
    ks = (kp >= S // 2).astype(np.int32)
    qs = (rng.random((B, T)) < 0.5).astype(np.int32)
    return tuple(jnp.asarray(x) for x in (qp, kp, qs, ks))


HEADS = {"mha": (4, 4), "gqa2": (4, 2), "mqa": (4, 1)}
# Each case compiles a kernel forward+backward and a reference VJP (~3 s on 2 cores), so instead
# of the 5 x 3 product: every mask once, every head layout at least twice, causal with all three.
KERNEL_CASES = [
    ("causal", "mha"),
    ("causal", "gqa2"),
    ("causal", "mqa"),
    ("causal_doc", "gqa2"),
    ("window", "mqa"),
    ("full", "gqa2"),
    ("full_doc_window", "mha"),
]


@pytest.mark.slow
@pytest.mark.parametrize("mask_name,heads_name", KERNEL_CASES)
def test_kernel_forward_backward_matches_reference(mask_name, heads_name):
    """Kernel forward (out, lse) and backward (dq, dk, dv) against the dense reference, with
    T != S, blocks that do not divide the lengths (they shrink), and differing q/k positions."""
    mask = MASKS[mask_name]
    N, K = HEADS[heads_name]
    B, T, S, H = 2, 24, 40, 8
    q, k, v, do = _inputs(B, T, S, N, K, H)
    qp, kp, qs, ks = _cross_positions(B, T, S)
    kern = XlaKernel(block_q=7, block_kv=16)  # -> 6 and 10 token blocks: 4 x 4 tiles
    out, lse = jax.jit(lambda *a: kernel_forward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)(
        q, k, v, qp, kp, qs, ks
    )
    ref = lambda q, k, v: reference_attention(
        q, k, v, mask=mask, positions=qp, segment_ids=qs, kv_positions=kp, kv_segment_ids=ks
    )
    ref_out, ref_grads = jax.jit(lambda q, k, v, do: _value_and_vjp(ref, do, q, k, v), compiler_options=FAST_COMPILE)(
        q, k, v, do
    )
    np.testing.assert_allclose(out, ref_out, atol=OUT_TOL, rtol=0)
    ref_lse = _dense_lse(q, k, qp, kp, qs, ks, mask)
    assert bool(jnp.all(jnp.isneginf(lse) == jnp.isneginf(ref_lse)))
    fin = jnp.isfinite(ref_lse)
    np.testing.assert_allclose(jnp.where(fin, lse, 0), jnp.where(fin, ref_lse, 0), atol=OUT_TOL, rtol=0)
    grads = jax.jit(lambda *a: kernel_backward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)(
        q, k, v, qp, kp, qs, ks, out, lse, do
    )
    for g, r in zip(grads, ref_grads):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, r, atol=GRAD_TOL, rtol=0)


# forward blocks, backward blocks (block_q_dkv, block_kv_dkv), and the backward's blocks after
# block_size clamps them to T = 64 queries and S = 96 keys
DKV_CASES = [
    ("causal_doc", "gqa2", (64, 64), (32, 16), (32, 16)),  # dividing: 2 x 6 backward tiles
    ("full_doc_window", "mqa", (64, 64), (20, 28), (16, 24)),  # not dividing: they shrink
]


@pytest.mark.slow
@pytest.mark.parametrize("mask_name,heads_name,fwd,dkv,clamped", DKV_CASES, ids=["dividing", "clamped"])
def test_kernel_backward_with_its_own_blocks_matches_reference(mask_name, heads_name, fwd, dkv, clamped):
    """block_q_dkv / block_kv_dkv tile the backward (its dQ accumulator is blocked by them), the
    forward keeps block_q / block_kv, and the gradients equal the dense reference's."""
    mask = MASKS[mask_name]
    N, K = HEADS[heads_name]
    B, T, S, H = 2, 64, 96, 8
    q, k, v, do = _inputs(B, T, S, N, K, H, seed=11)
    qp, kp, qs, ks = _cross_positions(B, T, S, seed=12)
    kern = XlaKernel(block_q=fwd[0], block_kv=fwd[1], block_q_dkv=dkv[0], block_kv_dkv=dkv[1])
    assert kern.backward_blocks == dkv and XlaKernel(block_q=5, block_kv=6).backward_blocks == (5, 6)
    # the blocks each pass really uses: the forward's accumulator has T / block_q query blocks,
    # the backward's dQ accumulator T / bq_dkv, and its (transposed) tiles are [B, K, bk, G bq]
    G = N // K
    assert kern.forward_start(QueryBlock(q, qp, qs), kv_heads=K)[1][0].shape[0] == T // fwd[0]
    zero = jnp.zeros((B, T, N), jnp.float32)
    assert kern.backward_start(QueryBlock(q, qp, qs), Cotangent(zero, do, zero), kv_heads=K)[1].shape == (
        T // clamped[0],
        B,
        K,
        H,
        G * clamped[0],
    )
    bwd_jaxpr = str(
        jax.make_jaxpr(lambda *a: kernel_backward(kern, *a, mask=mask))(q, k, v, qp, kp, qs, ks, q, zero, do)
    )
    assert f"f32[{B},{K},{clamped[1]},{G * clamped[0]}]" in bwd_jaxpr
    assert f"f32[{B},{K},{block_size(S, fwd[1])},{G * block_size(T, fwd[0])}]" not in bwd_jaxpr  # the forward's
    out, lse = jax.jit(lambda *a: kernel_forward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)(
        q, k, v, qp, kp, qs, ks
    )
    ref = lambda q, k, v: reference_attention(
        q, k, v, mask=mask, positions=qp, segment_ids=qs, kv_positions=kp, kv_segment_ids=ks
    )
    ref_out, ref_grads = jax.jit(lambda q, k, v, do: _value_and_vjp(ref, do, q, k, v), compiler_options=FAST_COMPILE)(
        q, k, v, do
    )
    np.testing.assert_allclose(out, ref_out, atol=OUT_TOL, rtol=0)
    grads = jax.jit(lambda *a: kernel_backward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)(
        q, k, v, qp, kp, qs, ks, out, lse, do
    )
    for g, r in zip(grads, ref_grads):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, r, atol=GRAD_TOL, rtol=0)


@pytest.mark.slow
def test_kernel_backward_is_additive_over_key_blocks():
    """The backward of a K/V block takes the GLOBAL out/lse, so summing the per-block gradients
    over disjoint key blocks gives the full gradient (what the ring backward relies on)."""
    mask = Mask(document=True)
    B, T, S, N, K, H = 1, 16, 32, 4, 2, 8
    q, k, v, do = _inputs(B, T, S, N, K, H, seed=3)
    qp, kp, qs, ks = _cross_positions(B, T, S, seed=4)
    kern = XlaKernel(block_q=8, block_kv=8)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(q, k, v, qp, kp, qs, ks, do):
        out, lse = kernel_forward(kern, q, k, v, qp, kp, qs, ks, mask=mask)
        full = kernel_backward(kern, q, k, v, qp, kp, qs, ks, out, lse, do, mask=mask)
        h = S // 2
        parts = [
            kernel_backward(kern, q, k[:, sl], v[:, sl], qp, kp[:, sl], qs, ks[:, sl], out, lse, do, mask=mask)
            for sl in (slice(0, h), slice(h, S))
        ]
        return full, parts

    full, parts = run(q, k, v, qp, kp, qs, ks, do)
    np.testing.assert_allclose(parts[0][0] + parts[1][0], full[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(jnp.concatenate([parts[0][1], parts[1][1]], 1), full[1], atol=1e-6, rtol=0)
    np.testing.assert_allclose(jnp.concatenate([parts[0][2], parts[1][2]], 1), full[2], atol=1e-6, rtol=0)


class ForwardBackwardOnly(AbstractComposedKernel):
    """A kernel with only ``forward`` and ``backward`` (like SplashKernel): it runs on
    :class:`AbstractComposedKernel`'s accumulating form (forward_start/step/finish, ...); its
    blocks, rules and price are the wrapped kernel's."""

    inner: XlaKernel
    blocks: BlockSizes = eqx.field(static=True)

    def __init__(self, inner):
        self.inner, self.blocks = inner, inner.blocks

    check_blocks = XlaKernel.check_blocks
    forward_bytes, backward_bytes = XlaKernel.forward_bytes, XlaKernel.backward_bytes
    prologue_bytes = XlaKernel.prologue_bytes

    def step_tile_bytes(self, batch, q_len, kv_len, group):
        return 0  # as splash: the ring's heads_per_pass counts no tiles

    def forward(self, q, kv, *, mask):
        return self.inner.forward(q, kv, mask=mask)

    def backward(self, q, kv, ct, *, mask):
        return self.inner.backward(q, kv, ct, mask=mask)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["xla", "xla_dkv", "defaults"])
def test_accumulating_form_equals_one_call(kind):
    """forward_start/step/finish and backward_start/step/finish over three disjoint K/V blocks of
    uneven lengths (what the ring does, one block per step) equal ONE forward/backward over all
    of them; backward_step ADDS into the dk/dv accumulators it is given. GQA, a causal document
    mask, queries that see no key at all. ``xla_dkv``: the backward on its own blocks (5 x 4
    tokens -> 4-query blocks, 4- and 2-key blocks of the pieces), unlike the forward's."""
    mask = Mask(document=True)
    B, T, S, N, K, H = 2, 24, 40, 4, 2, 8
    q, k, v, do = _inputs(B, T, S, N, K, H, seed=7)
    qp, kp, qs, ks = _cross_positions(B, T, S, seed=8)
    dkv = dict(block_q_dkv=5, block_kv_dkv=4) if kind == "xla_dkv" else {}
    xla = XlaKernel(block_q=7, block_kv=16, **dkv)
    kern = ForwardBackwardOnly(xla) if kind == "defaults" else xla
    cuts = [(0, 8), (8, 30), (30, 40)]  # 8 (one block), 22 (two of 11) and 10 keys

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(q, k, v, qp, kp, qs, ks, do):
        out, lse = kernel_forward(xla, q, k, v, qp, kp, qs, ks, mask=mask)
        whole = kernel_backward(xla, q, k, v, qp, kp, qs, ks, out, lse, do, mask=mask)
        blocks = [KVBlock(*(x[:, a:b] for x in (k, v, kp, ks))) for a, b in cuts]
        prep, acc = kern.forward_start(QueryBlock(q, qp, qs), kv_heads=K)
        for kvb in blocks:
            acc = kern.forward_step(prep, acc, kvb, mask=mask)
        out_s, lse_s = kern.forward_finish(prep, acc)
        prep, dq = kern.backward_start(QueryBlock(q, qp, qs), Cotangent(lse, do, output_delta(out, do)), kv_heads=K)
        dks, dvs = [], []
        for kvb in blocks:
            one = jnp.ones(kvb.k.shape, jnp.float32)
            dq, dk, dv = kern.backward_step(prep, (dq, one, -one), kvb, mask=mask)
            dks.append(dk - 1.0)
            dvs.append(dv + 1.0)
        dq = kern.backward_finish(prep, dq)
        return (out, lse, whole), (out_s, lse_s, (dq, jnp.concatenate(dks, 1), jnp.concatenate(dvs, 1)))

    (out, lse, whole), (out_s, lse_s, steps) = run(q, k, v, qp, kp, qs, ks, do)
    assert out_s.dtype == lse_s.dtype == jnp.float32
    np.testing.assert_allclose(out_s, out, atol=1e-5, rtol=0)
    assert bool(jnp.any(jnp.isneginf(lse)))  # the case is exercised
    assert bool(jnp.all(jnp.isneginf(lse_s) == jnp.isneginf(lse)))
    fin = jnp.isfinite(lse)
    np.testing.assert_allclose(jnp.where(fin, lse_s, 0), jnp.where(fin, lse, 0), atol=1e-5, rtol=0)
    for g, r in zip(steps, whole):
        assert g.dtype == jnp.float32 and g.shape == r.shape
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_no_visible_key_gives_zero_and_finite_grads():
    """Rows with no visible key: out exactly 0, lse -inf, flash_attention gradients finite and 0
    for those rows (no NaN anywhere)."""
    mask = Mask(document=True)
    B, T, N, K, H = 1, 16, 4, 2, 8
    q, k, v, do = _inputs(B, T, T, N, K, H, seed=5)
    pos = jnp.arange(T, dtype=jnp.int32)[None]
    kp = pos + 4  # causal: queries 0..3 see nothing
    seg = jnp.zeros((B, T), jnp.int32).at[:, 10].set(7)  # query 10 is alone in document 7
    kseg = jnp.zeros((B, T), jnp.int32)
    kern = XlaKernel(block_q=4, block_kv=4)
    out, lse = jax.jit(lambda *a: kernel_forward(kern, *a, mask=mask))(q, k, v, pos, kp, seg, kseg)
    empty = np.array([0, 1, 2, 3, 10])
    assert bool(jnp.all(out[:, empty] == 0)) and bool(jnp.all(jnp.isneginf(lse[:, empty])))
    assert bool(jnp.all(jnp.isfinite(lse[:, 4:10])))

    def loss(q, k, v):
        o = flash_attention(q, k, v, pos, kp, seg, kseg, mask=mask, kernel=kern)
        return jnp.sum(o * do)

    gq, gk, gv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for g in (gq, gk, gv):
        assert bool(jnp.all(jnp.isfinite(g)))
    assert bool(jnp.all(gq[:, empty] == 0))
    rq, rk, rv = jax.jit(
        jax.grad(
            lambda q, k, v: jnp.sum(
                reference_attention(
                    q, k, v, mask=mask, positions=pos, segment_ids=seg, kv_positions=kp, kv_segment_ids=kseg
                )
                * do
            ),
            argnums=(0, 1, 2),
        )
    )(q, k, v)
    for g, r in zip((gq, gk, gv), (rq, rk, rv)):
        np.testing.assert_allclose(g, r, atol=GRAD_TOL, rtol=0)


def test_flash_attention_bf16_returns_input_dtypes():
    mask = Mask()
    q, k, v, do = _inputs(1, 16, 16, 4, 1, 8, seed=6)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    pos = jnp.arange(16, dtype=jnp.int32)[None]
    seg = jnp.zeros((1, 16), jnp.int32)
    out, vjp = jax.vjp(lambda q, k, v: flash_attention(q, k, v, pos, pos, seg, seg, mask=mask), q, k, v)
    assert out.dtype == jnp.bfloat16
    assert [g.dtype for g in vjp(out)] == [jnp.bfloat16] * 3


def test_scale_is_one_over_sqrt_head_dim():
    """One key visible per query with two keys of known logits: checks the 1/sqrt(H) scale
    exactly (softmax weights of logits 0 and 1*16/sqrt(16) = 4)."""
    H = 16
    q = jnp.ones((1, 1, 1, H), jnp.float32)
    k = jnp.stack([jnp.zeros(H), jnp.ones(H) / H], 0)[None, :, None]  # q.k = 0 and 1
    v = jnp.stack([jnp.zeros(H), jnp.ones(H)], 0)[None, :, None]
    out, lse = kernel_forward(
        XlaKernel(block_q=1, block_kv=1),
        q,
        k,
        v,
        jnp.array([[5]], jnp.int32),
        jnp.array([[0, 1]], jnp.int32),
        jnp.zeros((1, 1), jnp.int32),
        jnp.zeros((1, 2), jnp.int32),
        mask=Mask(),
    )
    s = 1.0 / np.sqrt(H)  # q.k = 1 for the second key
    w = np.exp(s) / (1 + np.exp(s))
    np.testing.assert_allclose(out[0, 0, 0], np.full(H, w), rtol=1e-6)
    np.testing.assert_allclose(lse[0, 0, 0], np.log(1 + np.exp(s)), rtol=1e-6)


def test_block_size_clamps_and_divides():
    assert block_size(64, 512) == 64
    assert block_size(40, 16) == 10
    assert block_size(24, 7) == 6
    assert block_size(13, 4) == 1


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_may_be_visible_is_a_necessary_condition(mask_name):
    """False from the block predicate must mean the dense mask hides every pair (skipping is
    exact), and it does say False for blocks that are obviously hidden."""
    mask = MASKS[mask_name]
    rng = np.random.default_rng(0)
    n = 300  # random blocks, vmapped: [n, batch 2, block]
    qp = jnp.asarray(rng.integers(0, 64, (n, 2, 6)), jnp.int32)
    kp = jnp.asarray(rng.integers(0, 64, (n, 2, 5)), jnp.int32)
    qs = jnp.asarray(rng.integers(0, 3, (n, 2, 6)), jnp.int32)
    ks = jnp.asarray(rng.integers(0, 3, (n, 2, 5)), jnp.int32)
    may = np.asarray(jax.vmap(mask.may_be_visible)(qp, kp, qs, ks))
    any_visible = np.asarray(mask.visible(qp, kp, qs, ks).any(axis=(1, 2, 3)))
    assert not np.any(~may & any_visible)
    n_false = int((~may).sum())
    z = jnp.zeros((1, 4), jnp.int32)
    lo, hi = jnp.arange(4, dtype=jnp.int32)[None], jnp.arange(40, 44, dtype=jnp.int32)[None]
    if mask.causal:  # keys all after queries
        assert not bool(mask.may_be_visible(lo, hi, z, z))
    if mask.window is not None:  # keys far behind queries
        assert not bool(mask.may_be_visible(hi, lo, z, z))
    if mask.document:  # disjoint documents
        assert not bool(mask.may_be_visible(hi, lo, z, z + 1))
    if mask.chunk is not None:  # keys in an earlier chunk than every query
        assert not bool(mask.may_be_visible(lo + 2 * mask.chunk, lo, z, z))
    if mask.is_full:
        assert n_false == 0
    # blocks whose ONLY visible pair sits on the edge of a criterion must not be skipped
    ar = jnp.arange(4, dtype=jnp.int32)[None]
    edge_cases = [(ar, ar + 3, z, z)]  # causal edge: only (q=3, k=3)
    if mask.window is not None:
        edge_cases.append((ar + 20, ar + 20 - mask.window - 2, z, z))  # only q=20, k=20-window+1
    if mask.chunk is not None:  # only q=k=chunk, the first position of the second chunk
        edge_cases.append((ar + mask.chunk - 3, ar + mask.chunk, z, z))
    if mask.document:
        edge_cases.append((z, z, jnp.array([[0, 0, 0, 1]], jnp.int32), jnp.array([[1, 2, 2, 2]], jnp.int32)))
    for qp, kp, qs, ks in edge_cases:
        assert int(mask.visible(qp, kp, qs, ks).sum()) >= 1
        assert bool(mask.may_be_visible(qp, kp, qs, ks))


def test_merge_partials_equals_whole_and_handles_empty_rows():
    mask = Mask(document=True)
    B, T, S, N, K, H = 1, 8, 16, 2, 1, 4
    q, k, v, _ = _inputs(B, T, S, N, K, H, seed=7)
    qp, kp, qs, ks = _cross_positions(B, T, S, seed=8)
    kern = XlaKernel(block_q=4, block_kv=4)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(q, k, v, qp, kp, qs, ks):
        whole = kernel_forward(kern, q, k, v, qp, kp, qs, ks, mask=mask)
        a = kernel_forward(kern, q, k[:, :8], v[:, :8], qp, kp[:, :8], qs, ks[:, :8], mask=mask)
        b = kernel_forward(kern, q, k[:, 8:], v[:, 8:], qp, kp[:, 8:], qs, ks[:, 8:], mask=mask)
        return whole, merge_partials(*a, *b)

    whole, (out, lse) = run(q, k, v, qp, kp, qs, ks)
    np.testing.assert_allclose(out, whole[0], atol=1e-6, rtol=0)
    assert bool(jnp.all(jnp.isneginf(lse) == jnp.isneginf(whole[1])))
    e = jnp.full((1, 2, 1), -jnp.inf)
    o, l = merge_partials(jnp.zeros((1, 2, 1, 3)), e, jnp.zeros((1, 2, 1, 3)), e)
    assert bool(jnp.all(o == 0)) and bool(jnp.all(jnp.isneginf(l)))


def test_make_kernel_refuses_unknown_names_and_untileable_splash_blocks():
    # the splash kernel itself is tested in tests/test_attention_splash.py
    with pytest.raises(ValueError, match="multiple of 128"):
        make_kernel("splash", 64, 96)
    with pytest.raises(ValueError, match="block_q to be a positive multiple of 8"):
        make_kernel("splash", 60, 128)
    with pytest.raises(ValueError, match="unknown attention kernel"):
        make_kernel("cudnn")


def test_make_kernel_passes_the_backward_blocks_and_refuses_empty_ones():
    kern = make_kernel("xla", 64, 32, 16, 8)
    assert (kern.blocks.block_q, kern.blocks.block_kv, kern.blocks.block_q_dkv, kern.blocks.block_kv_dkv) == (
        64,
        32,
        16,
        8,
    )
    assert make_kernel("xla", 64, 32).backward_blocks == (64, 32)
    # one check, BlockSizes', whichever way the blocks are given
    with pytest.raises(ValueError, match=r"block_kv_dkv must be >= 1 token.*got 0"):
        XlaKernel(block_q=4, block_kv=4, block_kv_dkv=0)
    with pytest.raises(ValueError, match=r"block_q must be >= 1 token.*got 0"):
        make_kernel("xla", BlockSizes(block_q=0))
    assert make_kernel("xla", BlockSizes(64, 32, 16)) == XlaKernel(BlockSizes(64, 32, 16))


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_all_visible_is_a_sufficient_condition(mask_name):
    """True from Mask.all_visible must mean the dense mask shows every pair (the kernel then
    skips the element-wise mask), and it does say True for blocks that are obviously visible."""
    mask = MASKS[mask_name]
    rng = np.random.default_rng(1)
    n = 400
    qp = jnp.asarray(rng.integers(0, 64, (n, 2, 6)), jnp.int32)
    kp = jnp.asarray(rng.integers(0, 64, (n, 2, 5)), jnp.int32)
    qs = jnp.asarray(rng.integers(0, 2, (n, 2, 6)), jnp.int32)
    ks = jnp.asarray(rng.integers(0, 2, (n, 2, 5)), jnp.int32)
    full = np.asarray(jax.vmap(mask.all_visible)(qp, kp, qs, ks))
    every_visible = np.asarray(mask.visible(qp, kp, qs, ks).all(axis=(1, 2, 3)))
    assert not np.any(full & ~every_visible)
    may = np.asarray(jax.vmap(mask.may_be_visible)(qp, kp, qs, ks))
    assert not np.any(full & ~may)  # the three tile classes are consistent
    z = jnp.zeros((1, 4), jnp.int32)
    ar = jnp.arange(4, dtype=jnp.int32)[None]
    # queries right after their keys, one document: visible for every mask here but a window
    # or chunks shorter than the 8 positions spanned
    short = (mask.window is not None and mask.window <= 7) or (mask.chunk is not None and mask.chunk <= 7)
    assert bool(mask.all_visible(ar + 4, ar, z, z)) == (not short)
    if mask.chunk is not None:  # keys then queries inside one chunk, [2 chunk, 2 chunk + 7]
        c = 2 * mask.chunk
        assert bool(mask.all_visible(ar[:, :1] + c + 1, ar[:, :1] + c, z[:, :1], z[:, :1]))
        assert not bool(mask.all_visible(ar[:, :1] + c, ar[:, :1] + c - 1, z[:, :1], z[:, :1]))
    if mask.causal:  # the diagonal block is NOT fully visible
        assert not bool(mask.all_visible(ar, ar, z, z))
    if mask.document:  # two documents in the block
        assert not bool(mask.all_visible(ar + 4, ar, z, jnp.array([[0, 0, 1, 1]], jnp.int32)))
    if mask.is_full:
        assert bool(jnp.all(full))


def _tile_classes(mask, qp, kp, qs, ks, bq, bk):
    from lcx.attention.kernels.xla import tile_class

    T, S = qp.shape[1], kp.shape[1]
    return {
        int(tile_class(mask, qp[:, i : i + bq], kp[:, j : j + bk], qs[:, i : i + bq], ks[:, j : j + bk]))
        for i in range(0, T, bq)
        for j in range(0, S, bk)
    }


@pytest.mark.slow
@pytest.mark.parametrize("heads_name", ["mha", "gqa2"])
def test_kernel_three_tile_classes_match_reference(heads_name):
    """Packed documents whose boundaries fall both on and inside tile edges, causal: the kernel
    meets hidden tiles, fully visible tiles (no mask arithmetic) and partial tiles (additive
    bias) in one call, forward and backward, and must equal the dense reference."""
    from lcx.attention.kernels.xla import FULL, HIDDEN, PARTIAL

    mask = Mask(document=True)
    N, K = HEADS[heads_name]
    B, T, H, blk = 1, 48, 8, 8
    q, k, v, do = _inputs(B, T, T, N, K, H, seed=11)
    # documents [0, 24) (boundary on a tile edge) and [24, 43), [43, 48) (inside a tile)
    seg = np.zeros((B, T), np.int32)
    seg[:, 24:43], seg[:, 43:] = 1, 2
    pos = np.concatenate([np.arange(24), np.arange(19), np.arange(5)])[None].astype(np.int32)
    pos, seg = jnp.asarray(pos), jnp.asarray(seg)
    assert _tile_classes(mask, pos, pos, seg, seg, blk, blk) == {HIDDEN, FULL, PARTIAL}
    kern = XlaKernel(block_q=blk, block_kv=blk)
    out, lse = jax.jit(lambda *a: kernel_forward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)(
        q, k, v, pos, pos, seg, seg
    )
    ref = lambda q, k, v: reference_attention(q, k, v, mask=mask, positions=pos, segment_ids=seg)
    ref_out, ref_grads = jax.jit(lambda q, k, v, do: _value_and_vjp(ref, do, q, k, v), compiler_options=FAST_COMPILE)(
        q, k, v, do
    )
    np.testing.assert_allclose(out, ref_out, atol=OUT_TOL, rtol=0)
    np.testing.assert_allclose(lse, _dense_lse(q, k, pos, pos, seg, seg, mask), atol=OUT_TOL, rtol=0)
    grads = jax.jit(lambda *a: kernel_backward(kern, *a, mask=mask), compiler_options=FAST_COMPILE)(
        q, k, v, pos, pos, seg, seg, out, lse, do
    )
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, atol=GRAD_TOL, rtol=0)


@pytest.mark.slow
def test_fully_visible_tiles_take_the_unmasked_path():
    """A call whose every tile is fully visible (keys all before the queries, causal) runs only
    the unmasked branch, and still equals the reference; a kernel forced to mask those same
    tiles (document mask, one document) gives the same numbers."""
    from lcx.attention.kernels.xla import FULL

    B, T, N, K, H, blk = 1, 16, 4, 2, 8, 8
    q, k, v, do = _inputs(B, T, T, N, K, H, seed=12)
    kp = jnp.arange(T, dtype=jnp.int32)[None]
    qp = kp + T
    z = jnp.zeros((B, T), jnp.int32)
    assert _tile_classes(Mask(), qp, kp, z, z, blk, blk) == {FULL}
    kern = XlaKernel(block_q=blk, block_kv=blk)
    outs = {}
    for name, mask in (("causal", Mask()), ("full", Mask(causal=False))):
        out, lse = kernel_forward(kern, q, k, v, qp, kp, z, z, mask=mask)
        outs[name] = (out, lse, kernel_backward(kern, q, k, v, qp, kp, z, z, out, lse, do, mask=mask))
    ref = lambda q, k, v: reference_attention(q, k, v, mask=Mask(causal=False))
    ref_out, ref_grads = _value_and_vjp(ref, do, q, k, v)
    np.testing.assert_allclose(outs["causal"][0], ref_out, atol=OUT_TOL, rtol=0)
    for g, r in zip(outs["causal"][2], ref_grads):
        np.testing.assert_allclose(g, r, atol=GRAD_TOL, rtol=0)
    np.testing.assert_array_equal(outs["causal"][0], outs["full"][0])
