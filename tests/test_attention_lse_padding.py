"""Issue 18: ``attention(..., return_lse=True)``, padding as a negative segment id, the default
positions of a laid-out batch, ``merge_partials`` on invalid partial states, and arguments
attention() does not take.

The matrix (every strategy x both layouts x both kernels) compares ``(out, lse)`` and the
gradients of BOTH outputs with the dense float32 reference on padded, packed inputs: out within
5e-5, lse within 1e-5, dq/dk/dv (and d sinks) within 2e-4, padding rows exactly 0 / ``-inf``.
Shapes are tiny (B = 1, T = 64, 4 query / 2 kv heads of 8) and meshes use at most 4 of the 8
simulated devices, because the splash cases run Pallas in interpret mode; each case compiles
once for both layouts.
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from lcx.attention import Mask, attention, merge_partials, reference_attention
from lcx.attention.kernels import sorted_chunks
from lcx.attention.kernels import splash as splash_mod
from lcx.attention.kernels.jax_splash import splash_internals
from lcx.attention.kernels.xla import HIDDEN, tile_class
from lcx.sharding import AttentionConfig, Plan, apply_layout, bind, undo_layout

FAST_COMPILE = {"xla_backend_optimization_level": 0}
OUT_TOL = 5e-5
LSE_TOL = 1e-5
GRAD_TOL = 2e-4

B, T, N, K, H = 1, 64, 4, 2, 8

# strategy -> (mesh, seq rule, mask, with sinks): every strategy once per kernel, the flash VJP
# (allgather, a2a) and the ring VJP (ring, usp) each with and without sinks, padding under masks
# with and without the document mask (padding must not need it).
CASES = {
    "allgather": ((("context", 4),), "context", Mask(), False),
    "a2a": ((("context", 2),), "context", Mask(document=True), True),
    "ring": ((("context", 4),), "context", Mask(window=13), True),
    "usp": ((("ulysses", 2), ("ring", 2)), ("ulysses", "ring"), Mask(causal=False, document=True), False),
}


def _mesh_plan(strategy, kernel, block=None):
    mesh, seq, _, _ = CASES[strategy]
    # xla: small unequal blocks (several tiles per call, tile skipping exercised); splash: 128
    block_q, block_kv = (8, 16) if kernel == "xla" else (block or 128, 128)
    plan = Plan(
        mesh=mesh,
        activations={"seq": seq},
        attention=AttentionConfig(strategy=strategy, kernel=kernel, block_q=block_q, block_kv=block_kv),
    )
    n = int(np.prod([s for _, s in mesh]))
    return bind(plan, jax.devices()[:n])


def padded_documents():
    """Packed documents (positions restarting at 0) with a padded tail of 22 tokens marked -1,
    positions counting on like one pseudo-document (as lcx.data writes padding): int32 [B, T]."""
    seg = np.full((B, T), -1, np.int32)
    pos = np.zeros((B, T), np.int32)
    for lo, hi, s in ((0, 19, 0), (19, 42, 1)):
        seg[:, lo:hi] = s
        pos[:, lo:hi] = np.arange(hi - lo)
    pos[:, 42:] = np.arange(T - 42)
    return pos, seg


def _inputs(seed=0):
    ks = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(ks[0], (B, T, N, H), jnp.float32)
    k = jax.random.normal(ks[1], (B, T, K, H), jnp.float32)
    v = jax.random.normal(ks[2], (B, T, K, H), jnp.float32)
    do = jax.random.normal(ks[3], (B, T, N, H), jnp.float32)
    dl = jax.random.normal(ks[4], (B, T, N), jnp.float32)
    sinks = jax.random.normal(ks[5], (N,), jnp.float32)
    pos, seg = padded_documents()
    return q, k, v, jnp.asarray(pos), jnp.asarray(seg), do, dl, sinks


@functools.cache
def _reference(strategy):
    _, _, mask, with_sinks = CASES[strategy]
    q, k, v, pos, seg, do, dl, sinks = _inputs()

    def f(q, k, v, s):
        return reference_attention(
            q, k, v, mask=mask, positions=pos, segment_ids=seg, sinks=s if with_sinks else None, return_lse=True
        )

    (out, lse), vjp = jax.vjp(f, q, k, v, sinks)
    return out, lse, vjp((do, dl))


def _check_case(mp, strategy, layouts=("contiguous", "zigzag")):
    _, _, mask, with_sinks = CASES[strategy]
    q, k, v, pos, seg, do, dl, sinks = _inputs()
    ref_out, ref_lse, ref_grads = _reference(strategy)
    P = mp.context_degree

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(q, k, v, pos, seg, do, dl, sinks):
        def f(q, k, v, s):
            return attention(
                q,
                k,
                v,
                plan=mp,
                mask=mask,
                positions=pos,
                segment_ids=seg,
                sinks=s if with_sinks else None,
                return_lse=True,
            )

        (out, lse), vjp = jax.vjp(f, q, k, v, sinks)
        return out, lse, vjp((do, dl))

    pad = np.asarray(seg) < 0
    assert pad.any() and (~pad).any()
    for layout in layouts:
        lay = lambda x: apply_layout(x, layout, P, axis=1)
        un = lambda x: undo_layout(x, layout, P, axis=1)
        out, lse, grads = run(*(lay(x) for x in (q, k, v, pos, seg, do, dl)), sinks)
        assert lse.dtype == jnp.float32 and lse.shape == (B, T, N)
        assert lse.sharding.is_equivalent_to(mp.activation_sharding(("batch", "seq", "heads")), 3)
        out, lse = un(out), un(lse)
        dq, dk, dv = (un(g) for g in grads[:3])
        np.testing.assert_allclose(out, ref_out, atol=OUT_TOL, rtol=0, err_msg=layout)
        assert bool(jnp.all(jnp.isneginf(lse) == jnp.isneginf(ref_lse))), layout
        fin = jnp.isfinite(ref_lse)
        assert bool(fin.any())
        np.testing.assert_allclose(jnp.where(fin, lse, 0), jnp.where(fin, ref_lse, 0), atol=LSE_TOL, rtol=0)
        for g, r in zip((dq, dk, dv, grads[3]), ref_grads):
            assert bool(jnp.all(jnp.isfinite(g)))
            np.testing.assert_allclose(g, r, atol=GRAD_TOL, rtol=0, err_msg=layout)
        # padding: zero output and gradients, lse -inf (no sink either), exactly
        assert bool(jnp.all(out[pad] == 0)) and bool(jnp.all(jnp.isneginf(lse[pad])))
        assert bool(jnp.all(dq[pad] == 0)) and bool(jnp.all(dk[pad] == 0)) and bool(jnp.all(dv[pad] == 0))


MATRIX = [(s, kern) for kern in ("xla", "splash") for s in CASES]


@pytest.mark.slow
@pytest.mark.parametrize("strategy,kernel", MATRIX, ids=[f"{s}-{k}" for s, k in MATRIX])
def test_return_lse_and_padding_match_reference(strategy, kernel):
    # ring on splash runs 32-query forward blocks (a multiple of 8, the forward kernel's rule;
    # its dQ kernel then runs 128-query blocks): issue 18's block_q below 128, through a strategy
    block = 32 if (strategy, kernel) == ("ring", "splash") else None
    _check_case(_mesh_plan(strategy, kernel, block=block), strategy)


def test_return_lse_false_is_the_plain_output_and_true_needs_a_bool():
    mp = _mesh_plan("ring", "xla")
    q, k, v, pos, seg, *_ = _inputs()

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(q, k, v):
        plain = attention(q, k, v, plan=mp, mask=Mask(), positions=pos, segment_ids=seg)
        return plain, attention(q, k, v, plan=mp, mask=Mask(), positions=pos, segment_ids=seg, return_lse=True)[0]

    plain, out = run(q, k, v)
    np.testing.assert_array_equal(plain, out)
    # lcx's own check, as users see it: the test session's jaxtyping/beartype wrapper would refuse
    # the jax bool first with its own message
    with pytest.raises(TypeError, match="return_lse must be a Python bool"):
        inspect.unwrap(attention)(q, k, v, plan=mp, mask=Mask(), return_lse=jnp.bool_(True))


# --------------------------------------------------------------------------------------------
# positions=None under a non-contiguous layout (the snippet)


def test_positions_none_are_the_layouts_global_positions():
    """The issue's snippet: inputs laid out by a zigzag plan; positions=None must mean the
    tokens' true global positions (commit 37f8d75 used arange(T) in layout order: max error
    1.254 here; now equal to passing the laid-out positions, 2.4e-7 from the reference)."""
    mp = bind(
        Plan(
            mesh={"context": 4},
            activations={"seq": "context"},
            attention=AttentionConfig(strategy="ring", layout="zigzag"),
        ),
        jax.devices()[:4],
    )
    q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 64, 2, 16))
    zz = lambda x: apply_layout(x, "zigzag", 4, axis=1)
    ref = reference_attention(q, k, v, mask=Mask())

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(q, k, v):
        o_none = attention(q, k, v, plan=mp, mask=Mask())
        o_pos = attention(q, k, v, plan=mp, mask=Mask(), positions=zz(jnp.arange(64)[None]))
        return o_none, o_pos

    o_none, o_pos = (undo_layout(o, "zigzag", 4, axis=1) for o in run(zz(q), zz(k), zz(v)))
    assert float(jnp.abs(o_pos - ref).max()) <= 1e-6
    assert float(jnp.abs(o_none - ref).max()) <= 1e-6


# --------------------------------------------------------------------------------------------
# padding: fully padded blocks and ring steps are skipped


@pytest.mark.slow
@pytest.mark.parametrize("mask", [Mask(), Mask(causal=False), Mask(document=True), Mask(window=4)])
def test_fully_padded_blocks_are_hidden(mask):
    """The block predicate every strategy and the xla kernel skip by (ring steps: may_be_visible;
    tiles: tile_class) is False for a block of padding queries or keys, and the splash kernel's
    block mask skips padded kv blocks."""
    pos = jnp.arange(16, dtype=jnp.int32)[None]
    real, pad = jnp.zeros((1, 16), jnp.int32), jnp.full((1, 16), -1, jnp.int32)
    assert bool(mask.may_be_visible(pos, pos, real, real))
    for qs, ks in ((pad, real), (real, pad), (pad, pad)):
        assert not bool(mask.may_be_visible(pos, pos, qs, ks))
        assert not bool(mask.all_visible(pos, pos, qs, ks))
        assert int(tile_class(mask, pos, pos, qs, ks)) == HIDDEN
        assert not bool(mask.visible(pos, pos, qs, ks).any())
    # splash: 256 keys, the second 128-key block all padding -> block_mask 0 there
    L = 256
    p = jnp.arange(L, dtype=jnp.int32)
    seg = jnp.where(p < 128, 0, -1)
    plan = splash_mod._Plan(L, L, 128, 128)
    perm, lo, hi, empty = sorted_chunks.sorted_intervals(plan, mask, p, seg, p, seg)
    info, _ = splash_mod._block_info(splash_internals(), lo[0], hi[0], 128, 128, 2, empty[0])
    np.testing.assert_array_equal(info.block_mask[0], [[1, 0], [0, 0]])
    assert bool(empty[0, 128:].all()) and not bool(empty[0, :128].any())


# --------------------------------------------------------------------------------------------
# merge_partials on invalid partial states


def test_merge_partials_with_inf_or_nan_lse_drops_that_partial_and_checkify_raises():
    o_a, o_b = jnp.array([[1.0, 2.0]]), jnp.array([[3.0, 4.0]])
    for bad in (jnp.inf, jnp.nan):
        out, lse = merge_partials(o_a, jnp.array([0.5]), o_b, jnp.array([bad]))
        np.testing.assert_array_equal(out, o_a)  # 37f8d75: [[inf, inf]], [inf] (NaN for NaN)
        np.testing.assert_array_equal(lse, [0.5])
        out, lse = merge_partials(jnp.array([[jnp.nan, jnp.inf]]), jnp.array([bad]), o_b, jnp.array([-1.0]))
        np.testing.assert_array_equal(out, o_b)
        np.testing.assert_array_equal(lse, [-1.0])
        # both invalid: the empty row (out 0, lse -inf), never inf or NaN
        out, lse = jax.jit(merge_partials)(o_a, jnp.array([bad]), o_b, jnp.array([jnp.inf]))
        np.testing.assert_array_equal(out, [[0.0, 0.0]])
        assert bool(jnp.isneginf(lse).all())
        err, _ = checkify.checkify(merge_partials)(o_a, jnp.array([0.5]), o_b, jnp.array([bad]))
        with pytest.raises(checkify.JaxRuntimeError, match="merge_partials: a partial logsumexp is"):
            err.throw()
    # valid states (finite, -inf) pass the check
    err, _ = checkify.checkify(merge_partials)(o_a, jnp.array([0.5]), o_b * 0, jnp.array([-jnp.inf]))
    assert err.get() is None


def test_splash_chunk_merge_is_merge_partials():
    """The splash and tokamax adapters merge their kv chunks with merge_partials (in the driver
    they share; no second copy of the formula that could keep the +inf behaviour)."""
    assert not hasattr(splash_mod, "_merge") and not hasattr(sorted_chunks, "_merge")
    assert sorted_chunks.merge_partials is merge_partials


# --------------------------------------------------------------------------------------------
# arguments attention() does not take


@pytest.mark.parametrize(
    "kwarg,what",
    [
        ("dropout_rate", "no attention dropout"),
        ("softmax_scale", "softmax scale"),
        ("bias", "additive attention biases"),
        ("frobnicate", "not an argument"),
    ],
)
def test_unsupported_arguments_are_refused_with_what_attention_does_not_do(kwarg, what):
    mp = _mesh_plan("allgather", "xla")
    q, k, v, *_ = _inputs()
    with pytest.raises(TypeError, match=f"unsupported argument.*{kwarg}.*{what}.*does not do attention dropout"):
        attention(q, k, v, plan=mp, mask=Mask(), **{kwarg: 0.1})
    assert "Not supported" in attention.__doc__ and "dropout_rate" in attention.__doc__
