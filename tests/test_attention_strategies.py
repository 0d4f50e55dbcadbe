"""Context-parallel strategies through the public ``lcx.attention.attention`` on 8 CPU devices.

Every strategy must equal the dense single-device float32 reference (outputs within 5e-5,
dq/dk/dv within 2e-4) for every mask, head layout, degree and sequence layout. Each case runs
``jax.vjp`` of ``attention`` inside one outer ``jax.jit`` whose inputs are sharded by the plan.
"""

import functools
import inspect
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcx.attention import BlockSizes, Mask, attention, reference_attention
from lcx.sharding import AttentionConfig, Plan, PlanError, apply_layout, bind

# XLA:CPU backend optimisation level 0 halves compile time (LLVM codegen dominates it at these
# tiny shapes) without changing what the program computes. The correctness matrix uses it; the
# HLO and bf16 checks compile with default options, as users do.
FAST_COMPILE = {"xla_backend_optimization_level": 0}

OUT_TOL = 5e-5
GRAD_TOL = 2e-4

B, T, N, H = 2, 64, 8, 8
BLOCK_Q, BLOCK_KV = 8, 16  # small, unequal blocks: several tiles per kernel call, skipping exercised
WINDOW = 12

MASKS = {
    "causal": Mask(),
    "causal_doc": Mask(document=True),
    "window": Mask(window=WINDOW),
    "full": Mask(causal=False),
}
KV_HEADS = {"mha": 8, "gqa4": 2, "mqa": 1}

# Mesh, batch and sequence rules per strategy and degree. Degree 2 composes with a data axis,
# degree 8 splits the sequence over two mesh axes (one 8-device ring / all-to-all over a 2x4
# mesh), USP covers both orders of its axes in plan.activations.seq.
MESHES = {
    2: ((("data", 2), ("context", 2)), "data", "context"),
    4: ((("data", 1), ("context", 4)), "data", "context"),
    8: ((("context", 2), ("ring", 4)), None, ("context", "ring")),
}
USP_MESHES = {  # ulysses x ring
    2: ((("data", 2), ("ulysses", 2), ("ring", 2)), "data", ("ulysses", "ring")),  # 2x2 (+ data 2)
    4: ((("ulysses", 2), ("ring", 4)), None, ("ulysses", "ring")),  # 2x4
    8: ((("ring", 2), ("ulysses", 4)), None, ("ring", "ulysses")),  # 4x2, ring axis major
}
USP_NAMES = {2: "2x2", 4: "2x4", 8: "4x2"}  # the USP configs take the place of degrees 2, 4, 8
STRATEGY_NAMES = ("allgather", "a2a", "ring", "usp")


def make_mesh_plan(strategy, degree, **attn):
    mesh, batch, seq = (USP_MESHES if strategy == "usp" else MESHES)[degree]
    plan = Plan(
        mesh=mesh,
        activations={"batch": batch, "seq": seq},
        attention=AttentionConfig(**{"strategy": strategy, "block_q": BLOCK_Q, "block_kv": BLOCK_KV, **attn}),
    )
    n = math.prod(s for _, s in mesh)
    return bind(plan, jax.devices()[:n])


def documents(seed=0):
    """Packed documents: segment ids and positions restarting at 0 in every document (as the
    lcx.data packer writes them), int32 [B, T]."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((B, T), np.int32)
    pos = np.zeros((B, T), np.int32)
    for b in range(B):
        cuts = np.sort(rng.choice(np.arange(3, T - 3), size=3, replace=False))
        bounds = [0, *cuts, T]
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            seg[b, lo:hi] = i
            pos[b, lo:hi] = np.arange(hi - lo)
    return pos, seg


def inputs(mask_name, heads, seed=0, dtype=jnp.float32):
    """Original-order inputs (q, k, v, positions, segment_ids, dout) as numpy arrays."""
    K = KV_HEADS[heads]
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (B, T, N, H), jnp.float32).astype(dtype)
    k = jax.random.normal(ks[1], (B, T, K, H), jnp.float32).astype(dtype)
    v = jax.random.normal(ks[2], (B, T, K, H), jnp.float32).astype(dtype)
    do = jax.random.normal(ks[3], (B, T, N, H), jnp.float32)
    if MASKS[mask_name].document:
        pos, seg = documents(seed)
    else:
        pos, seg = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)), np.zeros((B, T), np.int32)
    return tuple(np.asarray(x) for x in (q, k, v, pos, seg, do))


def _value_and_vjp(f, ct, *args):
    out, vjp = jax.vjp(f, *args)
    return out, vjp(ct)


@functools.cache
def reference(mask_name, heads):
    """Dense float32 reference output and (dq, dk, dv), in the ORIGINAL sequence order."""
    q, k, v, pos, seg, do = inputs(mask_name, heads)
    mask = MASKS[mask_name]
    f = lambda q, k, v: reference_attention(q, k, v, mask=mask, positions=pos, segment_ids=seg)
    out, grads = jax.jit(lambda q, k, v, do: _value_and_vjp(f, do, q, k, v), compiler_options=FAST_COMPILE)(q, k, v, do)
    return np.asarray(out), tuple(np.asarray(g) for g in grads)


def sharded(mp, q, k, v, pos, seg, do):
    """Place global arrays as the plan shards them (what a training step's inputs look like)."""
    qs = mp.activation_sharding(("batch", "seq", "heads", "head_dim"))
    ps = mp.activation_sharding(("batch", "seq"))
    return tuple(jax.device_put(x, s) for x, s in ((q, qs), (k, qs), (v, qs), (pos, ps), (seg, ps), (do, qs)))


def attention_vjp_fn(mp, mask, compiler_options=FAST_COMPILE):
    """jit(q, k, v, positions, segment_ids, dout) -> (out, (dq, dk, dv)) through ``attention``."""

    def f(q, k, v, pos, seg, do):
        fn = lambda q, k, v: attention(q, k, v, plan=mp, mask=mask, positions=pos, segment_ids=seg)
        return _value_and_vjp(fn, do, q, k, v)

    return jax.jit(f, compiler_options=compiler_options)


def _lay(x, layout, degree, ids=None, block=None):
    """``x`` (``[B, T, ...]``) in ``layout``; ``ids``: the original (positions, segment_ids), which
    the balanced layout is computed from, row by row, in chunks of at least ``block`` tokens
    where the length allows (None: ``BLOCK_KV``)."""
    pos, seg = ids if ids is not None else (None, None)
    block = BLOCK_KV if block is None else block
    return np.asarray(apply_layout(np.asarray(x), layout, degree, axis=1, positions=pos, segment_ids=seg, block=block))


def check_against_reference(mp, mask_name, heads, layouts=("contiguous", "zigzag", "balanced")):
    """Run every layout through ONE compiled function; compare with the permuted reference.
    Returns the max errors (out, grads)."""
    fn = attention_vjp_fn(mp, MASKS[mask_name])
    ref_out, ref_grads = reference(mask_name, heads)
    P = mp.context_degree
    errs = []
    for layout in layouts:
        original = inputs(mask_name, heads)
        ids = (original[3], original[4])
        laid = [_lay(x, layout, P, ids) for x in original]
        out, grads = fn(*sharded(mp, *laid))
        assert out.sharding.is_equivalent_to(mp.activation_sharding(("batch", "seq", "heads", "head_dim")), 4)
        e_out = np.abs(np.asarray(out) - _lay(ref_out, layout, P, ids)).max()
        e_grad = max(np.abs(np.asarray(g) - _lay(r, layout, P, ids)).max() for g, r in zip(grads, ref_grads))
        assert e_out <= OUT_TOL, (layout, e_out)
        assert e_grad <= GRAD_TOL, (layout, e_grad)
        errs.append((e_out, e_grad))
    return errs


# --------------------------------------------------------------------------------------------
# The correctness matrix. The full product strategy x mask x heads x degree x layout is
# 4 x 4 x 3 x 3 x 2 = 288 cases, ~3 s of compilation each on 2 cores. Instead:
# - layout costs no compilation (same shapes), so EVERY case runs both layouts;
# - per strategy, 12 cases (mask m, heads h, degree d) with d = (h + m) mod 3: every
#   (mask, heads) pair once, every (mask, degree) pair once, every (heads, degree) pair at least
#   once (m = 0, 1, 2 shift the degree through all three). So every pair of the four compiled
#   axes is covered for each strategy, and all 48 strategy x mask x heads x degree triples that
#   matter most (strategy with each of the others) are covered pairwise.
MATRIX = [
    (s, m, h, d)
    for s in STRATEGY_NAMES
    for mi, m in enumerate(MASKS)
    for hi, h in enumerate(KV_HEADS)
    for d in [(2, 4, 8)[(hi + mi) % 3]]
]


# The floor stack (-m "not slow") runs each strategy's first case; the current stack all 48.
FLOOR_CASES = {next(c for c in MATRIX if c[0] == s) for s in STRATEGY_NAMES}


@pytest.mark.parametrize(
    "strategy,mask_name,heads,degree",
    [pytest.param(*c, marks=() if c in FLOOR_CASES else pytest.mark.slow) for c in MATRIX],
    ids=[f"{s}-{m}-{h}-{USP_NAMES[d] if s == 'usp' else d}" for s, m, h, d in MATRIX],
)
def test_strategy_matches_reference(strategy, mask_name, heads, degree):
    mp = make_mesh_plan(strategy, degree)
    assert mp.context_degree == ({2: 4, 4: 8, 8: 8}[degree] if strategy == "usp" else degree)
    check_against_reference(mp, mask_name, heads)


# --------------------------------------------------------------------------------------------
# Heads sharded over a tensor axis as well (kv heads follow the query heads' sharding).
TENSOR_CASES = {  # name: (mesh, seq rule, heads rule, head layout)
    # a2a: 4 query / 1 kv head per tensor shard, Ulysses degree 4 -> each kv head replicated 4x
    "a2a": ((("tensor", 2), ("context", 4)), "context", "tensor", "gqa4"),
    "ring": ((("tensor", 2), ("context", 4)), "context", "tensor", "gqa4"),
    "usp": ((("tensor", 2), ("ulysses", 2), ("ring", 2)), ("ring", "ulysses"), "tensor", "mha"),
    # heads NOT sharded: every array is replicated over the tensor axis, whose gradient
    # cotangents shard_map must then sum exactly once
    "allgather-replicated": ((("tensor", 2), ("context", 4)), "context", None, "gqa4"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_heads_sharded_over_tensor_axis(case):
    mesh, seq, heads_rule, heads = TENSOR_CASES[case]
    plan = Plan(
        mesh=mesh,
        activations={"seq": seq, "heads": heads_rule},
        attention=AttentionConfig(strategy=case.split("-")[0], block_q=BLOCK_Q, block_kv=BLOCK_KV),
    )
    check_against_reference(bind(plan, jax.devices()), "causal_doc", heads)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["allgather", "a2a", "ring"])
def test_context_degree_one_is_the_local_kernel(strategy):
    """A plan with no sequence axes: the strategy degenerates to the local kernel, with no
    collective at all (batch split over data only)."""
    plan = Plan(
        mesh=(("data", 2),),
        activations={"batch": "data"},
        attention=AttentionConfig(strategy=strategy, block_q=BLOCK_Q, block_kv=BLOCK_KV),
    )
    mp = bind(plan, jax.devices()[:2])
    assert mp.context_degree == 1
    check_against_reference(mp, "window", "gqa4", layouts=("contiguous",))
    fn = attention_vjp_fn(mp, MASKS["window"])
    text = fn.lower(*sharded(mp, *inputs("window", "gqa4"))).compile().as_text()
    for op in ("collective-permute", "all-to-all", "all-gather", "all-reduce"):
        assert op not in text, op


@pytest.mark.slow
def test_unbound_plan_binds_to_all_devices_and_runs_eagerly():
    plan = Plan(
        mesh=(("data", 1), ("context", -1)),
        activations={"batch": "data", "seq": "context"},
        attention=AttentionConfig(strategy="ring", layout="zigzag", block_q=BLOCK_Q, block_kv=BLOCK_KV),
    )
    q, k, v, pos, seg, _ = (_lay(x, "zigzag", 8) for x in inputs("causal", "gqa4"))
    out = attention(q, k, v, plan=plan, mask=MASKS["causal"], positions=pos, segment_ids=seg)
    assert len(out.sharding.device_set) == 8
    np.testing.assert_allclose(out, _lay(reference("causal", "gqa4")[0], "zigzag", 8), atol=OUT_TOL, rtol=0)


# --------------------------------------------------------------------------------------------
# Queries that see no key at all: output 0 and finite gradients, in every strategy (on the ring
# such rows are empty in every step and must survive the logsumexp merges).
@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_query_with_no_visible_key(strategy):
    mask = MASKS["causal_doc"]
    q, k, v, pos, seg, do = inputs("causal_doc", "gqa4")
    kv_pos = pos + 3  # causal: queries at positions 0, 1, 2 of every document see nothing
    q_seg = seg.copy()
    q_seg[:, 40] = 99  # a query in a document of its own that has no keys
    ref_fn = lambda q, k, v: reference_attention(
        q, k, v, mask=mask, positions=pos, segment_ids=q_seg, kv_positions=kv_pos, kv_segment_ids=seg
    )
    ref_out, ref_grads = jax.jit(lambda q, k, v: _value_and_vjp(ref_fn, do, q, k, v))(q, k, v)
    empty = ~np.asarray(mask.visible(pos, kv_pos, q_seg, seg).any(-1))  # [B, T]
    assert empty.sum() >= 9

    mp = make_mesh_plan(strategy, 4)
    P = mp.context_degree

    def f(q, k, v, qp, kp, qs, ks, do):
        fn = lambda q, k, v: attention(
            q, k, v, plan=mp, mask=mask, positions=qp, segment_ids=qs, kv_positions=kp, kv_segment_ids=ks
        )
        return _value_and_vjp(fn, do, q, k, v)

    lay = lambda x: _lay(x, "zigzag", P)
    out, grads = jax.jit(f, compiler_options=FAST_COMPILE)(*map(lay, (q, k, v, pos, kv_pos, q_seg, seg, do)))
    out = np.asarray(out)
    assert np.all(out[lay(empty)] == 0)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.all(np.asarray(grads[0])[lay(empty)] == 0)
    np.testing.assert_allclose(out, lay(ref_out), atol=OUT_TOL, rtol=0)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, lay(r), atol=GRAD_TOL, rtol=0)


# --------------------------------------------------------------------------------------------
# bfloat16: the error against the float32 truth may be at most twice that of the single-device
# bf16 computation (reference_attention on the same bf16 inputs).
@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_bf16_error_within_twice_single_device(strategy):
    mask = MASKS["causal_doc"]
    q, k, v, pos, seg, _ = inputs("causal_doc", "gqa4", seed=1, dtype=jnp.bfloat16)
    truth = reference_attention(
        *(jnp.asarray(x, jnp.float32) for x in (q, k, v)), mask=mask, positions=pos, segment_ids=seg
    )
    single = reference_attention(q, k, v, mask=mask, positions=pos, segment_ids=seg)
    err_single = float(jnp.abs(single.astype(jnp.float32) - truth).max())
    assert err_single > 0  # bf16 rounding must show, or the comparison below means nothing
    mp = make_mesh_plan(strategy, 4)
    P = mp.context_degree
    lay = lambda x: _lay(x, "zigzag", P)
    fn = jax.jit(lambda q, k, v, p, s: attention(q, k, v, plan=mp, mask=mask, positions=p, segment_ids=s))
    out = fn(*map(lay, (q, k, v, pos, seg)))
    assert out.dtype == jnp.bfloat16
    err = float(np.abs(np.asarray(out, np.float32) - lay(truth)).max())
    assert err <= 2 * err_single, (err, err_single)


# --------------------------------------------------------------------------------------------
# Communication: what the compiled programs contain, and how many K/V hops the ring makes.
def _compiled_text(strategy, degree, heads="gqa4"):
    mp = make_mesh_plan(strategy, degree)
    fn = attention_vjp_fn(mp, MASKS["causal"], compiler_options=None)
    return fn.lower(*sharded(mp, *inputs("causal", heads))).compile().as_text()


def test_ring_hlo_has_collective_permute_and_no_all_gather():
    text = _compiled_text("ring", 8)
    assert "collective-permute" in text
    assert "all-gather" not in text
    assert "all-to-all" not in text


def test_a2a_hlo_has_all_to_all_and_no_kv_all_gather():
    text = _compiled_text("a2a", 4)
    assert "all-to-all" in text
    assert "collective-permute" not in text
    # only positions / segment ids (int32) are all-gathered, never float K/V
    gathers = [l for l in text.splitlines() if "all-gather(" in l or "all-gather-start(" in l]
    assert gathers and all("f32[" not in l.split("all-gather")[0] for l in gathers), gathers


def test_allgather_gathers_kv_without_repeating_gqa_heads():
    text = _compiled_text("allgather", 4)
    gathered = [l.split("all-gather")[0] for l in text.splitlines() if "all-gather(" in l or "all-gather-start(" in l]
    f32 = [l for l in gathered if "f32[" in l]
    assert f32, gathered
    # K/V gathered at their own kv-head count (2), full sequence (64): never at 8 query heads
    assert all(f"f32[{B},{T},{KV_HEADS['gqa4']},{H}]" in l for l in f32), f32


def _count_primitive(jaxpr, name):
    """Executions of primitive ``name`` in a jaxpr: scan bodies count ``length`` times."""
    n = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == name:
            n += 1
        mult = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        subs = []
        for p in eqn.params.values():
            for x in p if isinstance(p, (tuple, list)) else (p,):
                if hasattr(x, "jaxpr") and hasattr(x, "consts"):  # ClosedJaxpr
                    subs.append(x.jaxpr)
                elif hasattr(x, "eqns"):  # Jaxpr
                    subs.append(x)
        if eqn.primitive.name == "cond":
            n += max(_count_primitive(s, name) for s in subs)
        else:
            n += mult * sum(_count_primitive(s, name) for s in subs)
    return n


@pytest.mark.parametrize("degree", [2, 8])
def test_ring_makes_exactly_p_minus_one_kv_hops(degree):
    """Forward: P-1 hops of (k, v, positions, segment ids) and no wasted final transfer.
    Backward: P-1 hops of K/V again plus P hops of the (dK, dV) accumulators (the last one brings
    them home)."""
    mp = make_mesh_plan("ring", degree)
    P = mp.context_degree
    args = sharded(mp, *inputs("causal", "gqa4"))
    fwd = jax.make_jaxpr(
        lambda q, k, v, p, s: attention(q, k, v, plan=mp, mask=MASKS["causal"], positions=p, segment_ids=s)
    )
    assert _count_primitive(fwd(*args[:5]).jaxpr, "ppermute") == 4 * (P - 1)
    both = jax.make_jaxpr(attention_vjp_fn(mp, MASKS["causal"], compiler_options=None))(*args)
    assert _count_primitive(both.jaxpr, "ppermute") == 4 * (P - 1) + 4 * (P - 1) + 2 * P


# --------------------------------------------------------------------------------------------
# Invalid configurations are refused with a clear error before anything compiles (eval_shape
# only traces).
def _abstract(shape_q, shape_kv, T_=T):
    B_ = shape_q[0]
    sds = jax.ShapeDtypeStruct
    return (
        sds(shape_q, jnp.float32),
        sds(shape_kv, jnp.float32),
        sds(shape_kv, jnp.float32),
        sds((B_, T_), jnp.int32),
        sds((B_, T_), jnp.int32),
    )


def _eval(mp, shape_q, shape_kv, mask=MASKS["causal"]):
    # lcx's own refusals, as users see them: unwrap the test session's jaxtyping/beartype check,
    # which would refuse mismatched shapes first with its own message
    return jax.eval_shape(
        lambda q, k, v, p, s: inspect.unwrap(attention)(q, k, v, plan=mp, mask=mask, positions=p, segment_ids=s),
        *_abstract(shape_q, shape_kv, shape_q[1]),
    )


@pytest.mark.parametrize(
    "strategy,degree,attn,shape_q,shape_kv,match",
    [
        ("a2a", 8, {}, (1, 64, 12, 8), (1, 64, 4, 8), "Ulysses degree 8 .* must divide the 12 query heads"),
        (
            "a2a",
            8,
            {},
            (1, 64, 24, 8),
            (1, 64, 3, 8),
            "3 kv heads per device cannot be split over the Ulysses degree 8",
        ),
        ("a2a", 4, {"allow_kv_replication": False}, (1, 64, 8, 8), (1, 64, 2, 8), "allow_kv_replication"),
        ("usp", 8, {}, (1, 64, 6, 8), (1, 64, 2, 8), "Ulysses degree 4 .* must divide the 6 query heads"),
        ("ring", 8, {}, (1, 60, 8, 8), (1, 60, 2, 8), "sequence length 60 is not divisible by 8"),
        ("allgather", 2, {}, (3, 64, 8, 8), (3, 64, 2, 8), "batch 3 is not divisible by 2"),
        ("ring", 4, {}, (1, 64, 8, 8), (1, 64, 3, 8), "multiple of kv heads"),
        ("ring", 4, {}, (1, 64, 8, 8), (1, 32, 8, 8), "must match q"),
    ],
)
def test_invalid_configs_raise_before_compiling(strategy, degree, attn, shape_q, shape_kv, match):
    mp = make_mesh_plan(strategy, degree, **attn)
    with pytest.raises(ValueError, match=match):
        _eval(mp, shape_q, shape_kv)


def test_kv_heads_must_follow_tensor_sharding():
    plan = Plan(
        mesh=(("tensor", 2), ("context", 4)),
        activations={"seq": "context", "heads": "tensor"},
        attention=AttentionConfig(strategy="ring"),
    )
    with pytest.raises(ValueError, match="1 kv heads cannot follow the query heads"):
        _eval(bind(plan), (1, 64, 8, 8), (1, 64, 1, 8))


def test_splash_kernel_with_untileable_blocks_is_refused_by_name():
    """Refused when the plan is built, before anything is traced (a TPU could not lower them:
    tests/test_tpu_lowering.py)."""
    with pytest.raises(PlanError, match="block_q to be a positive multiple of 8"):
        make_mesh_plan("ring", 4, kernel="splash", block_q=60)
    with pytest.raises(PlanError, match="block_kv to be a positive multiple of 128"):
        make_mesh_plan("ring", 4, kernel="splash", block_q=64, block_kv=64)


def test_registry_maps_every_plan_strategy_to_a_strategy_class():
    from lcx.attention import STRATEGIES, Strategy
    from lcx.sharding import STRATEGIES as PLAN_STRATEGIES

    assert set(STRATEGIES) == set(PLAN_STRATEGIES)
    assert all(issubclass(c, Strategy) for c in STRATEGIES.values())


# --------------------------------------------------------------------------------------------
# Ring passes over kv-head groups (the default for large shards, see ring.heads_per_pass): the
# same numbers as one pass, and every pass makes its own P-1 hops.
def _check_ring_against_reference(mp, strategy, heads):
    """Run ``strategy`` (a 4-device ring, zigzag, causal + document mask) forward and backward
    and compare with the single-device float32 reference; returns the traced function and its
    sharded inputs (for counting collectives)."""
    qs, ps = (mp.plan.activation_spec(a) for a in (("batch", "seq", "heads", "head_dim"), ("batch", "seq")))
    from lcx.attention import KVBlock, QueryBlock

    def local(q, k, v, q_pos, k_pos, q_seg, k_seg):
        return strategy(QueryBlock(q, q_pos, q_seg), KVBlock(k, v, k_pos, k_seg))

    fn = jax.shard_map(local, mesh=mp.mesh, in_specs=(qs, qs, qs, ps, ps, ps, ps), out_specs=qs, check_vma=False)
    ref_out, ref_grads = reference("causal_doc", heads)
    q, k, v, pos, seg, do = (_lay(x, "zigzag", 4) for x in inputs("causal_doc", heads))
    q, k, v, pos, seg, do = sharded(mp, q, k, v, pos, seg, do)
    f = lambda q, k, v, p, s, do: _value_and_vjp(lambda q, k, v: fn(q, k, v, p, p, s, s), do, q, k, v)
    out, grads = jax.jit(f, compiler_options=FAST_COMPILE)(q, k, v, pos, seg, do)
    np.testing.assert_allclose(out, _lay(ref_out, "zigzag", 4), atol=OUT_TOL, rtol=0)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, _lay(r, "zigzag", 4), atol=GRAD_TOL, rtol=0)
    return f, (q, k, v, pos, seg, do)


@pytest.mark.parametrize("kv_heads_per_pass", [1, 2])
def test_ring_in_kv_head_passes_matches_reference(kv_heads_per_pass):
    from lcx.attention import Ring
    from lcx.attention.kernels import XlaKernel

    mp = make_mesh_plan("ring", 4)
    strategy = Ring(
        kernel=XlaKernel(BLOCK_Q, BLOCK_KV),
        mask=MASKS["causal_doc"],
        axes=("context",),
        degree=4,
        kv_heads_per_pass=kv_heads_per_pass,
    )
    f, (q, k, v, pos, seg, do) = _check_ring_against_reference(mp, strategy, "mha")
    passes = KV_HEADS["mha"] // kv_heads_per_pass
    both = jax.make_jaxpr(f)(q, k, v, pos, seg, do)
    assert _count_primitive(both.jaxpr, "ppermute") == passes * (8 * 3 + 2 * 4)


def test_ring_with_a_forward_backward_only_kernel_matches_reference():
    """The ring on a kernel that implements only forward and backward (like splash), i.e. on the
    Kernel defaults of the accumulating form, with GQA and a document mask."""
    from lcx.attention import Ring
    from lcx.attention.kernels import AbstractComposedKernel, XlaKernel

    class ForwardBackwardOnly(AbstractComposedKernel):
        inner: XlaKernel
        blocks: BlockSizes = eqx.field(static=True)

        def __init__(self, inner):
            self.inner, self.blocks = inner, inner.blocks

        check_blocks = XlaKernel.check_blocks
        forward_bytes, backward_bytes, prologue_bytes = (
            XlaKernel.forward_bytes,
            XlaKernel.backward_bytes,
            XlaKernel.prologue_bytes,
        )

        def step_tile_bytes(self, batch, q_len, kv_len, group):
            return 0

        def forward(self, q, kv, *, mask):
            return self.inner.forward(q, kv, mask=mask)

        def backward(self, q, kv, ct, *, mask):
            return self.inner.backward(q, kv, ct, mask=mask)

    mp = make_mesh_plan("ring", 4)
    strategy = Ring(
        kernel=ForwardBackwardOnly(XlaKernel(BLOCK_Q, BLOCK_KV)), mask=MASKS["causal_doc"], axes=("context",), degree=4
    )
    _check_ring_against_reference(mp, strategy, "gqa4")


def test_ring_with_backward_blocks_of_its_own_matches_reference():
    """plan.attention.block_q_dkv / block_kv_dkv reach the ring's kernel through ``attention``
    (8 devices, 8 tokens each: forward 8 x 8, backward 4 x 2 and, not dividing, 3 x 5 -> 2 x 4)
    and the gradients still equal the reference's, in both layouts."""
    from lcx.attention.api import build_strategy

    for dkv in ((4, 2), (3, 5)):
        mp = make_mesh_plan("ring", 8, block_q_dkv=dkv[0], block_kv_dkv=dkv[1])
        strategy, _ = build_strategy(mp, MASKS["causal_doc"], (B, T, N, H), (B, T, KV_HEADS["gqa4"], H))
        assert (strategy.kernel.blocks.block_q_dkv, strategy.kernel.blocks.block_kv_dkv) == dkv
        check_against_reference(mp, "causal_doc", "gqa4")


def test_ring_heads_per_pass_rule():
    from lcx.attention.strategies.ring import heads_per_pass

    assert heads_per_pass((1, 512, 8, 64), jnp.float32) == 8  # 1 MiB shard: one pass
    assert heads_per_pass((1, 2048, 8, 64), jnp.float32) == 1  # 4 MiB: one kv head per pass
    assert heads_per_pass((2, 64, 2, 8), jnp.float32) == 2  # test sizes: one pass
    # the kernel's tiles count too: the backward's three 256 x 256 float32 tiles of 8 heads are
    # 6 MiB beside a 1 MiB shard, so one kv head per pass
    from lcx.attention.kernels import XlaKernel

    xla = XlaKernel(block_q=256, block_kv=256)
    assert xla.step_tile_bytes(1, 512, 512, 1) == 3 * 256 * 256 * 4
    assert heads_per_pass((1, 512, 8, 64), jnp.float32, xla.step_tile_bytes(1, 512, 512, 1)) == 1
    # the larger pass decides: a 3-tile backward on wider blocks than the forward's
    wide = XlaKernel(block_q=64, block_kv=64, block_q_dkv=128, block_kv_dkv=128)
    assert wide.step_tile_bytes(2, 512, 512, 4) == 4 * 2 * 4 * 3 * 128 * 128
    # blocks clamped to the lengths; the backward (3 tiles) is the larger pass at equal blocks
    assert XlaKernel(block_q=512, block_kv=512).step_tile_bytes(1, 100, 60, 1) == 4 * 3 * 100 * 60
    assert heads_per_pass((2, 64, 2, 8), jnp.float32, XlaKernel().step_tile_bytes(2, 64, 64, 1)) == 2
    with pytest.raises(ValueError, match="must divide the 8 kv heads"):
        from lcx.attention import KVBlock, QueryBlock, Ring

        x = jnp.zeros((1, 8, 8, 4))
        p = jnp.zeros((1, 8), jnp.int32)
        ring = Ring(kernel=XlaKernel(), mask=Mask(), axes=("context",), degree=1, kv_heads_per_pass=3)
        ring(QueryBlock(x, p, p), KVBlock(x, x, p, p))
