"""Attention sinks (a learnable per-head sink logit, :mod:`lcx.attention.sinks`) in every strategy
and kernel, against the dense single-device float32 reference, on 8 simulated CPU devices.

The reference gains the sink as one more logit column whose value is 0; every strategy
(allgather, a2a, ring, usp) with each kernel (xla, splash in interpret mode) must match it in
the output and in the gradients of q, k, v AND the sinks, within the strategy tests' bounds
(outputs 5e-5, gradients 2e-4, never loosened), in every sequence layout (one compilation per
case). Then: ``sinks=None`` is the plain program (a sink of -inf gives bitwise its results), a
query with no visible key stays 0 and finite with a sink, and a small Llama with
``attention_sinks=True`` has the same loss and gradients on 8 devices under ring as on one.
"""

import functools
import inspect
import math
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcx.attention import attention, reference_attention
from lcx.sharding import AttentionConfig, Plan, bind

sys.path.insert(0, str(Path(__file__).parent))
import test_attention_strategies as strategies  # noqa: E402  (shared strategy-matrix helpers)

OUT_TOL = strategies.OUT_TOL  # 5e-5, the same bounds as every strategy test
GRAD_TOL = strategies.GRAD_TOL  # 2e-4, for dq, dk, dv and d sinks alike
FAST_COMPILE = strategies.FAST_COMPILE
N = strategies.N

# one sink per query head, spread over the range of the rows' logsumexps (a few keys with unit
# logits: lse ~ 0..4), so some heads put most of their mass on the sink and others little
SINKS = np.linspace(-2.0, 3.0, N, dtype=np.float32)[np.random.default_rng(0).permutation(N)]


def _value_and_vjp(f, ct, *args):
    out, vjp = jax.vjp(f, *args)
    return out, vjp(ct)


@functools.cache
def reference(mask_name, heads):
    """Dense float32 reference with sinks: output and (dq, dk, dv, dsinks), original order."""
    q, k, v, pos, seg, do = strategies.inputs(mask_name, heads)
    mask = strategies.MASKS[mask_name]
    f = lambda q, k, v, s: reference_attention(q, k, v, mask=mask, positions=pos, segment_ids=seg, sinks=s)
    out, grads = jax.jit(lambda *a: _value_and_vjp(f, do, *a), compiler_options=FAST_COMPILE)(q, k, v, SINKS)
    return np.asarray(out), tuple(np.asarray(g) for g in grads)


def sinks_vjp_fn(mp, mask):
    """jit(q, k, v, positions, segment_ids, dout, sinks) -> (out, (dq, dk, dv, dsinks))."""

    def f(q, k, v, pos, seg, do, sinks):
        fn = lambda q, k, v, s: attention(q, k, v, plan=mp, mask=mask, positions=pos, segment_ids=seg, sinks=s)
        return _value_and_vjp(fn, do, q, k, v, sinks)

    return jax.jit(f, compiler_options=FAST_COMPILE)


def check_sinks_against_reference(mp, mask_name, heads, layouts=("contiguous", "zigzag", "balanced")):
    """Every layout (of ``layouts``) through ONE compiled function; returns the max errors (out,
    dq/dk/dv, dsinks)."""
    fn = sinks_vjp_fn(mp, strategies.MASKS[mask_name])
    ref_out, ref_grads = reference(mask_name, heads)
    P = mp.context_degree
    lay = strategies._lay
    errs = []
    for layout in layouts:
        original = strategies.inputs(mask_name, heads)
        ids = (original[3], original[4])  # the balanced layout is computed from them, row by row
        laid = [lay(x, layout, P, ids) for x in original]
        out, grads = fn(*strategies.sharded(mp, *laid), SINKS)
        assert grads[3].dtype == jnp.float32 and grads[3].shape == (N,)
        e_out = np.abs(np.asarray(out) - lay(ref_out, layout, P, ids)).max()
        e_qkv = max(np.abs(np.asarray(g) - lay(r, layout, P, ids)).max() for g, r in zip(grads[:3], ref_grads[:3]))
        e_sink = np.abs(np.asarray(grads[3]) - ref_grads[3]).max()  # per head: no sequence axis to lay out
        assert e_out <= OUT_TOL, (layout, e_out)
        assert e_qkv <= GRAD_TOL, (layout, e_qkv)
        assert e_sink <= GRAD_TOL, (layout, e_sink)
        errs.append((e_out, e_qkv, e_sink))
    return errs


def test_reference_sink_is_an_extra_zero_value_key():
    """The reference's sink equals a dense NumPy softmax over the visible logits plus one extra
    column ``sinks[n]`` whose value vector is 0 (float64), and it changes the result."""
    q, k, v, pos, seg, _ = strategies.inputs("causal_doc", "gqa4")
    mask = strategies.MASKS["causal_doc"]
    got = np.asarray(reference_attention(q, k, v, mask=mask, positions=pos, segment_ids=seg, sinks=SINKS))
    B, T, _, H = q.shape
    K = k.shape[2]
    G = N // K
    vis = np.asarray(mask.visible(pos, pos, seg, seg))  # [B, T, S]
    want = np.zeros((B, T, N, H))
    for n in range(N):
        s = np.einsum("bth,bsh->bts", q[:, :, n].astype(np.float64), k[:, :, n // G].astype(np.float64)) / math.sqrt(H)
        s = np.where(vis, s, -np.inf)
        logits = np.concatenate([s, np.full((B, T, 1), float(SINKS[n]))], axis=-1)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want[:, :, n] = np.einsum("bts,bsh->bth", p[..., :-1], v[:, :, n // G].astype(np.float64))
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    plain = np.asarray(reference_attention(q, k, v, mask=mask, positions=pos, segment_ids=seg))
    assert np.abs(plain - got).max() > 0.1  # the sinks matter at these values


# --------------------------------------------------------------------------------------------
# Every strategy x kernel. xla: each strategy once, all mask kinds with a sequence split (causal,
# document, window), every head layout (MHA, GQA, MQA with Ulysses kv replication), sequences
# split over two mesh axes (degree 8) and beside a data axis (the sinks' gradient is summed over
# batch and sequence shards). splash: the splash strategy cases' shapes, 128-token blocks.
XLA_CASES = [  # strategy, mask, heads, degree (strategies.MESHES / USP_MESHES key)
    ("allgather", "causal_doc", "gqa4", 2),  # data 2 x context 2
    ("a2a", "causal", "mqa", 8),  # Ulysses over 2x4 axes, each kv head replicated 8x
    ("ring", "causal_doc", "gqa4", 8),  # ring over 2x4 axes
    ("usp", "window", "mha", 2),  # data 2 x ulysses 2 x ring 2
]
SPLASH_CASES = [
    ("allgather", "window", "mqa", 2),
    ("a2a", "causal_doc", "gqa4", 4),
    ("ring", "causal_doc", "gqa4", 4),
    ("usp", "causal", "mha", 8),  # ring 4 (major) x ulysses 2
]
CASES = [(*c, "xla") for c in XLA_CASES] + [(*c, "splash") for c in SPLASH_CASES]


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,mask_name,heads,degree,kernel", CASES, ids=[f"{s}-{m}-{h}-{d}-{k}" for s, m, h, d, k in CASES]
)
def test_strategy_with_sinks_matches_reference(monkeypatch, strategy, mask_name, heads, degree, kernel):
    if kernel == "splash":  # splash blocks are multiples of 128: T = 64 is padded to one block
        monkeypatch.setattr(strategies, "BLOCK_Q", 128)
        monkeypatch.setattr(strategies, "BLOCK_KV", 128)
    mp = strategies.make_mesh_plan(strategy, degree, kernel=kernel)
    check_sinks_against_reference(mp, mask_name, heads)


# Heads sharded over a tensor axis: each device owns the sinks of its tensor shard's heads, and
# Ulysses then hands each device a slice of those.
TENSOR_CASES = {  # name: (mesh, seq rule, heads layout)
    "a2a": ((("tensor", 2), ("context", 4)), "context", "gqa4"),  # 4 q / 1 kv head per shard, U = 4
    "usp": ((("tensor", 2), ("ulysses", 2), ("ring", 2)), ("ring", "ulysses"), "mha"),
}


@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_sinks_with_heads_sharded_over_tensor_axis(case):
    mesh, seq, heads = TENSOR_CASES[case]
    plan = Plan(
        mesh=mesh,
        activations={"seq": seq, "heads": "tensor"},
        attention=AttentionConfig(strategy=case, block_q=strategies.BLOCK_Q, block_kv=strategies.BLOCK_KV),
    )
    check_sinks_against_reference(bind(plan, jax.devices()), "causal_doc", heads)


# --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["a2a", "ring"])  # the flash VJP (with Ulysses slicing), the ring VJP
def test_sinks_none_is_the_plain_attention(strategy):
    """A sink of -inf adds nothing: output and dq/dk/dv bitwise equal to ``sinks=None`` (the
    program without sinks; its compiled HLO is unchanged by this feature), and d sinks = 0."""
    mp = strategies.make_mesh_plan(strategy, 4)
    mask = strategies.MASKS["causal_doc"]
    args = strategies.sharded(
        mp, *(strategies._lay(x, "zigzag", mp.context_degree) for x in strategies.inputs("causal_doc", "gqa4"))
    )
    out0, grads0 = strategies.attention_vjp_fn(mp, mask)(*args)
    out1, grads1 = sinks_vjp_fn(mp, mask)(*args, np.full((N,), -np.inf, np.float32))
    np.testing.assert_array_equal(out1, out0)
    for a, b in zip(grads1[:3], grads0):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(grads1[3], np.zeros(N, np.float32))


@pytest.mark.parametrize("strategy", ["allgather", "ring"])
def test_query_with_no_visible_key_stays_zero_with_a_sink(strategy):
    """A row that sees no key gets the sink only: out 0, zero dq, finite gradients everywhere,
    and the sink gradient still matches the reference (such rows contribute 0 to it)."""
    mask = strategies.MASKS["causal_doc"]
    q, k, v, pos, seg, do = strategies.inputs("causal_doc", "gqa4")
    kv_pos = pos + 3  # causal: queries at positions 0, 1, 2 of every document see nothing
    q_seg = seg.copy()
    q_seg[:, 40] = 99  # a query in a document of its own that has no keys
    ref_fn = lambda q, k, v, s: reference_attention(
        q, k, v, mask=mask, positions=pos, segment_ids=q_seg, kv_positions=kv_pos, kv_segment_ids=seg, sinks=s
    )
    ref_out, ref_grads = jax.jit(lambda *a: _value_and_vjp(ref_fn, do, *a))(q, k, v, SINKS)
    empty = ~np.asarray(mask.visible(pos, kv_pos, q_seg, seg).any(-1))  # [B, T]
    assert empty.sum() >= 9

    mp = strategies.make_mesh_plan(strategy, 4)
    lay = lambda x: strategies._lay(x, "zigzag", mp.context_degree)

    def f(q, k, v, qp, kp, qs, ks, do, sinks):
        fn = lambda q, k, v, s: attention(
            q, k, v, plan=mp, mask=mask, positions=qp, segment_ids=qs, kv_positions=kp, kv_segment_ids=ks, sinks=s
        )
        return _value_and_vjp(fn, do, q, k, v, sinks)

    out, grads = jax.jit(f, compiler_options=FAST_COMPILE)(*map(lay, (q, k, v, pos, kv_pos, q_seg, seg, do)), SINKS)
    out = np.asarray(out)
    assert np.all(out[lay(empty)] == 0)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.all(np.asarray(grads[0])[lay(empty)] == 0)
    np.testing.assert_allclose(out, lay(ref_out), atol=OUT_TOL, rtol=0)
    for g, r in zip(grads[:3], ref_grads[:3]):
        np.testing.assert_allclose(g, lay(r), atol=GRAD_TOL, rtol=0)
    np.testing.assert_allclose(grads[3], ref_grads[3], atol=GRAD_TOL, rtol=0)


def test_attention_refuses_sinks_of_the_wrong_shape():
    mp = strategies.make_mesh_plan("ring", 2)
    sds = jax.ShapeDtypeStruct
    q = sds((2, 64, 8, 8), jnp.float32)
    kv = sds((2, 64, 2, 8), jnp.float32)
    for bad in (sds((4,), jnp.float32), sds((8,), jnp.int32)):
        with pytest.raises(ValueError, match=r"sinks must be a float array of shape \[heads\] = \(8,\)"):
            # lcx's own check, as users see it (not the test session's jaxtyping/beartype wrapper)
            jax.eval_shape(
                lambda q, k, v, s: inspect.unwrap(attention)(
                    q, k, v, plan=mp, mask=strategies.MASKS["causal"], sinks=s
                ),
                q,
                kv,
                kv,
                bad,
            )


# --------------------------------------------------------------------------------------------
# The model: ``attention_sinks=True`` adds a [layers, heads] parameter on the "heads" axis.
@pytest.mark.slow
def test_model_sink_parameter_shape_axes_and_ledger():
    from lcx import cost
    from lcx.models import ModelConfig, hf, init_model, logical_axes, preset

    cfg = preset("tiny").replace(attention_sinks=True)
    abstract = eqx.filter_eval_shape(init_model, cfg, key=jax.random.key(0))
    assert abstract.blocks.attn.sinks.shape == (cfg.n_layers, cfg.n_heads)
    assert logical_axes(abstract).blocks.attn.sinks == ("layers", "heads")
    assert init_model(cfg, key=jax.random.key(0)).blocks.attn.sinks.sum() == 0  # zero init
    assert eqx.filter_eval_shape(init_model, preset("tiny"), key=jax.random.key(0)).blocks.attn.sinks is None
    leaves = [l for l in jax.tree_util.tree_leaves(abstract) if hasattr(l, "shape")]
    assert sum(math.prod(l.shape) for l in leaves) == cfg.n_params == preset("tiny").n_params + 2 * 4
    axes = jax.tree_util.tree_leaves(logical_axes(abstract), is_leaf=lambda x: isinstance(x, tuple))
    got = sorted((tuple(l.shape), tuple(a)) for l, a in zip(leaves, axes))
    assert got == sorted((a.shape, a.axes) for a in cost.param_arrays(cfg))  # the ledger mirrors it
    # lcx's own ValueError, or (under the test session's jaxtyping/beartype hook, which checks the
    # dataclass's annotations first) a TypeError naming the same field
    with pytest.raises((ValueError, TypeError), match="attention_sinks"):
        ModelConfig(attention_sinks="yes")
    with pytest.raises(hf.HFImportError, match="no attention sinks"):
        hf.hf_config(
            {
                "model_type": "llama",
                "vocab_size": 64,
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "intermediate_size": 64,
            },
            attention_sinks=True,
        )


@pytest.mark.slow
def test_model_with_sinks_on_eight_devices_equals_one_device(devices):
    """A small Llama with sinks (set away from their zero init) under ring attention (zigzag,
    fsdp_ring: data x context) on 8 devices: the loss and every gradient, the sinks' included,
    equal the one-device ones."""
    import test_training as training

    from lcx.models import init_model
    from lcx.sharding.config import preset

    cfg = training.SMALL.replace(attention_sinks=True)
    model = init_model(cfg, key=jax.random.key(0))
    L, Nh = cfg.n_layers, cfg.n_heads
    model = eqx.tree_at(
        lambda m: m.blocks.attn.sinks,
        model,
        jnp.asarray(np.random.default_rng(1).uniform(-1.0, 3.0, (L, Nh)), jnp.float32),
    )
    plan = preset("fsdp_ring")
    assert plan.attention.strategy == "ring"
    B, S = 8, 128
    degree = plan.context_degree(8)
    batch = training._batch(B, S, plan.attention.layout, degree)
    plan.validate(8, dims=cfg.dims(), seq_len=S, global_batch=B)
    loss8, g8 = training._loss_and_grads(model, batch, bind(plan, devices))
    one = plan.with_mesh(**{n: 1 for n, _ in plan.mesh})
    loss1, g1 = training._loss_and_grads(model, batch, bind(one, devices[:1]))
    # the sinks do get a gradient, well above the comparison's atol (so it cannot pass on two
    # zeros): its size depends on the random init, which differs between jax releases (largest
    # sink gradient 8.3e-5 on jax 0.12.0.1, above 1e-4 on jax 0.10.2)
    grad_atol = 1e-6
    assert float(jnp.abs(g1.blocks.attn.sinks).max()) > 20 * grad_atol
    np.testing.assert_allclose(float(loss8), float(loss1), rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g8), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=grad_atol)
