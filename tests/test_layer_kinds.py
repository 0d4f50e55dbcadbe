"""Layer kinds (:mod:`lcx.models.kinds`): hybrid models against a per-layer reference.

A hybrid model (global / sliding / chunked layers, each kind with its own RoPE and sinks) must
give, forward AND backward, what a plain Python loop over its layers gives, each layer written
out by hand here (its window or chunk, RoPE base or none, sinks) with dense masks
(:func:`lcx.attention.reference_attention`), in float32 within the model tests' bounds (logits
1e-5, gradients rtol 1e-5 atol 1e-6). The same hybrid model under ring attention on 8 simulated
devices (contiguous and zigzag) must equal one device. The forward scans over pattern periods:
one scan whose body holds the P layers of a period, whatever the depth. A reference with a
wrong window differs by far more than the bounds (so these tests can fail). Then the config:
errors, the remainder rule, YAML / Hydra / code forms.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import test_model
from _compile_cache import compile_cache

import lcx.models as lm
from lcx.attention import Mask, reference_attention
from lcx.models.kinds import LayerKind, layer_kinds, parse_layer_pattern
from lcx.sharding import AttentionConfig, Plan, bind, layout_permutation

BASE = lm.ModelConfig(
    name="kinds", vocab_size=64, d_model=32, n_layers=5, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64
)
LOGIT_TOL = {"rtol": 1e-5, "atol": 1e-5}  # tests/test_model.py's forward bound
GRAD_TOL = {"rtol": 1e-5, "atol": 1e-6}  # tests/test_attention_sinks.py's model-gradient bound


# Each case: the config and its layers spelt out by hand, (window, chunk, rope theta or None,
# rope scaling (type, factor) or None, sinks), never derived from lcx's layer_kinds.
def hybrid(cfg=BASE, **changes):
    """``cfg`` with ``changes``, ``layer_pattern`` in its YAML form (as from_dict reads it)."""
    return lm.ModelConfig.from_dict({**cfg.to_dict(), **changes})


def _s(window, theta=10_000.0, sinks=False, scaling=None):
    return dict(window=window, chunk=None, theta=theta, scaling=scaling, sinks=sinks)


def _c(chunk, theta=10_000.0):
    return dict(window=None, chunk=chunk, theta=theta, scaling=None, sinks=False)


def _g(theta=10_000.0, sinks=False, scaling=None):
    return dict(window=None, chunk=None, theta=theta, scaling=scaling, sinks=sinks)


CASES = {
    # Gemma-3-like: two sliding layers (base 100) per global one (base 10^4), 5 layers: the
    # remainder (layers 4, 5) takes the pattern's first two kinds
    "sliding_global": (
        hybrid(layer_pattern=[{"kind": "sliding", "window": 3, "rope_theta": 100.0, "repeat": 2}, {"kind": "global"}]),
        [_s(3, 100.0), _s(3, 100.0), _g(), _s(3, 100.0), _s(3, 100.0)],
    ),
    # Llama-4-like: chunked RoPE layers and global layers without RoPE (NoPE), 4 layers; remat
    # per layer with the named residuals (q, k, v and the attention context) kept
    "chunked_nope_global": (
        hybrid(
            n_layers=4,
            layer_pattern=[{"kind": "chunked", "chunk": 4}, {"kind": "global", "rope": False}],
            remat="custom",
            remat_qkv="device",
            remat_context="device",
        ),
        [_c(4), _g(None), _c(4), _g(None)],
    ),
    # gpt-oss-like sinks on the sliding kind only; the global kind with its own yarn scaling
    "sinks_on_sliding": (
        hybrid(
            n_layers=3,
            layer_pattern=[
                {"kind": "sliding", "window": 5, "sinks": True},
                {"kind": "global", "rope_theta": 500.0, "rope_scaling_type": "yarn", "rope_scaling_factor": 4.0},
            ],
            rope_original_max_len=16,
        ),
        [_s(5, sinks=True), _g(500.0, scaling=("yarn", 4.0)), _s(5, sinks=True)],
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


one_device = test_model.one_device  # the one-device plan fixture
packed = test_model.packed  # tokens, positions, segment ids [B, T] of rows of packed documents


ROWS = [[11, 5], [16]]  # B = 2, T = 16: two documents in the first row


def make_model(cfg, seed=0):
    """A model whose sink logits (if any) are set away from their zero init."""
    model = lm.init_model(cfg, key=jax.random.key(seed))
    if model.blocks.attn.sinks is not None:
        sinks = np.random.default_rng(1).uniform(-1.0, 3.0, (cfg.n_layers, cfg.n_heads))
        model = eqx.tree_at(lambda m: m.blocks.attn.sinks, model, jnp.asarray(sinks, jnp.float32))
    return model


# ---------------------------------------------------------------------- the per-layer reference
def reference_logits(model, cfg, layers, tok, pos, seg):
    """The forward pass as a plain loop over the hand-written ``layers``, dense masks per layer."""
    H = cfg.head_dim

    def rms(x, g):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + cfg.norm_eps) * g

    def rotary(x, spec):
        if spec["theta"] is None:
            return x
        stype, factor = spec["scaling"] or (None, None)
        rc = lm.RopeConfig(H, spec["theta"], stype, factor, original_max_len=cfg.rope_original_max_len)
        return lm.rope(x, pos, rc.frequencies(), scale=rc.attention_scaling)

    x = model.embed.weight[tok]
    for l, spec in enumerate(layers):
        b = jax.tree.map(lambda a: a[l], model.blocks)
        h = rms(x, b.attn_norm.weight)
        q = rotary(jnp.einsum("btd,dnh->btnh", h, b.attn.wq), spec)
        k = rotary(jnp.einsum("btd,dkh->btkh", h, b.attn.wk), spec)
        v = jnp.einsum("btd,dkh->btkh", h, b.attn.wv)
        mask = Mask(causal=True, document=cfg.document_mask, window=spec["window"], chunk=spec["chunk"])
        sinks = b.attn.sinks if spec["sinks"] else None
        o = reference_attention(q, k, v, mask=mask, positions=pos, segment_ids=seg, sinks=sinks)
        x = x + jnp.einsum("btnh,nhd->btd", o, b.attn.wo)
        h = rms(x, b.mlp_norm.weight)
        x = x + (jax.nn.silu(h @ b.mlp.w_gate) * (h @ b.mlp.w_up)) @ b.mlp.w_down
    return rms(x, model.final_norm.weight) @ model.head


def _loss(logits, tok):
    targets = jnp.roll(tok, -1, axis=1)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1))


def model_value_and_grad(model, tok, pos, seg, plan):
    def f(m):
        logits = m(tok, pos, seg, plan=plan)
        return _loss(logits, tok), logits

    return eqx.filter_jit(eqx.filter_value_and_grad(f, has_aux=True))(model)


def reference_value_and_grad(model, cfg, layers, tok, pos, seg):
    def f(m):
        logits = reference_logits(m, cfg, layers, tok, pos, seg)
        return _loss(logits, tok), logits

    return eqx.filter_jit(eqx.filter_value_and_grad(f, has_aux=True))(model)


def assert_close_grads(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **GRAD_TOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_hybrid_model_equals_per_layer_reference(case, one_device):
    cfg, layers = CASES[case]
    assert len(layers) == cfg.n_layers
    model = make_model(cfg)
    tok, pos, seg = packed(ROWS, cfg.vocab_size)
    (loss, logits), grads = model_value_and_grad(model, tok, pos, seg, one_device)
    (ref_loss, ref_logits), ref_grads = reference_value_and_grad(model, cfg, layers, tok, pos, seg)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), **LOGIT_TOL)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6, atol=1e-6)
    assert_close_grads(grads, ref_grads)
    if cfg.has_sinks:
        # sink logits of layers whose kind has no sinks are unused: exactly zero gradient
        used = np.array([s["sinks"] for s in layers])
        g = np.asarray(grads.blocks.attn.sinks)
        assert np.all(g[~used] == 0) and np.abs(g[used]).max() > 20 * GRAD_TOL["atol"]


def test_wrong_window_is_far_outside_the_bounds(one_device):
    """The comparison can fail: a reference whose sliding layers use window 4 instead of 3."""
    cfg, layers = CASES["sliding_global"]
    model = make_model(cfg)
    tok, pos, seg = packed(ROWS, cfg.vocab_size)
    (_, logits), _ = model_value_and_grad(model, tok, pos, seg, one_device)
    wrong = [dict(s, window=4) if s["window"] else s for s in layers]
    (_, ref_logits), _ = reference_value_and_grad(model, cfg, wrong, tok, pos, seg)
    assert float(jnp.abs(logits - ref_logits).max()) > 100 * LOGIT_TOL["atol"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_hybrid_model_under_ring_equals_one_device(devices, one_device, layout):
    """Every kind of the hybrid models (sliding + global, sinks on one kind) under ring on 8
    devices (context 4 x data 2): the loss and every gradient equal one device's."""
    cfg, _ = CASES["sinks_on_sliding"]
    cfg = cfg.replace(n_layers=5, layer_pattern=(*cfg.layer_pattern, LayerKind("chunked", chunk=4)))
    plan = Plan(
        mesh=(("data", 2), ("context", 4)),
        activations={"batch": "data", "seq": ("context",)},
        attention=AttentionConfig(strategy="ring", layout=layout, block_q=2, block_kv=2),
    )
    plan.validate(8, dims=cfg.dims(), seq_len=16, global_batch=2)
    model = make_model(cfg)
    tok, pos, seg = packed(ROWS, cfg.vocab_size)
    perm = layout_permutation(layout, 16, 4)
    tok, pos, seg = tok[:, perm], pos[:, perm], seg[:, perm]
    (loss8, _), g8 = model_value_and_grad(model, tok, pos, seg, bind(plan, devices))
    (loss1, _), g1 = model_value_and_grad(model, tok, pos, seg, one_device)
    np.testing.assert_allclose(float(loss8), float(loss1), rtol=1e-6, atol=1e-6)
    assert_close_grads(g8, g1)


# ---------------------------------------------------------------------- the scan over periods
def _count(jaxpr, name, *, into_shard_map=False):
    """Equations of primitive ``name`` (None: every equation) in ``jaxpr`` and its sub-jaxprs
    (pjit, checkpoint, scan bodies), inside shard_map (attention's own loops) only if asked."""
    n = 0
    for eqn in jaxpr.eqns:
        n += name is None or eqn.primitive.name == name
        if eqn.primitive.name == "shard_map" and not into_shard_map:
            continue
        for v in eqn.params.values():
            for sub in v if isinstance(v, (list, tuple)) else (v,):
                if isinstance(sub, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    n += _count(getattr(sub, "jaxpr", sub), name, into_shard_map=into_shard_map)
    return n


def _layer_scans(cfg, plan):
    model = eqx.filter_eval_shape(lm.init_model, cfg, key=jax.random.key(0))
    tok = jnp.zeros((1, 8), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda m: m.features(tok, tok, tok, plan=plan))(model).jaxpr
    scans = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    return jaxpr, scans


@pytest.mark.parametrize("remat", ["none", "full"])
def test_one_scan_whose_body_holds_one_period(one_device, remat):
    """P = 3 kinds: one scan over the periods, its body three layers (three attention calls),
    the remainder outside; the program does not grow with depth."""
    pattern = (LayerKind("sliding", window=3), LayerKind("chunked", chunk=4), LayerKind("global", rope=False))
    sizes = {}
    for L in (7, 13):
        cfg = BASE.replace(n_layers=L, layer_pattern=pattern, remat=remat)
        jaxpr, scans = _layer_scans(cfg, one_device)
        assert len(scans) == 1 and scans[0].params["length"] == L // 3
        assert _count(scans[0].params["jaxpr"].jaxpr, "shard_map") == 3
        assert _count(scans[0].params["jaxpr"].jaxpr, "scan") == 0
        assert _count(jaxpr, "shard_map") == 3 + 1  # the body's and the one remainder layer's
        sizes[L] = _count(jaxpr, None, into_shard_map=True)
    assert sizes[7] == sizes[13]
    # a uniform model: P = 1
    jaxpr, scans = _layer_scans(BASE, one_device)
    assert len(scans) == 1 and _count(scans[0].params["jaxpr"].jaxpr, "shard_map") == 1


# ---------------------------------------------------------------------- config
def test_remainder_layers_take_the_patterns_first_kinds():
    pattern = parse_layer_pattern([{"kind": "sliding", "window": 1024, "repeat": 5}, {"kind": "global"}])
    kinds = layer_kinds(pattern, 26)
    assert [i + 1 for i, k in enumerate(kinds) if k.kind == "global"] == [6, 12, 18, 24]  # Gemma 3, 26 layers
    cfg = lm.preset("tiny").replace(n_layers=26, layer_pattern=pattern)
    assert cfg.layer_kinds == tuple(dataclasses.replace(k, sinks=False) for k in kinds)
    assert [k.kind for k in BASE.replace(n_layers=2, layer_pattern=pattern).layer_kinds] == ["sliding"] * 2


def test_uniform_model_kinds():
    assert BASE.layer_kinds == (LayerKind("global", sinks=False),) * 5
    cfg = BASE.replace(sliding_window=7, attention_sinks=True)
    assert cfg.layer_kinds == (LayerKind("sliding", window=7, sinks=True),) * 5
    assert cfg.layer_kinds[0].mask(True) == Mask(causal=True, document=True, window=7)
    assert LayerKind("chunked", chunk=8).mask(False) == Mask(causal=True, chunk=8)


def test_parameters_and_sinks_per_kind():
    """One stack [L, ...] whatever the kinds; the sink logits exist iff some kind has sinks."""
    cfg, _ = CASES["sinks_on_sliding"]
    for c in (cfg, CASES["sliding_global"][0], cfg.replace(attention_sinks=True)):
        abstract = eqx.filter_eval_shape(lm.init_model, c, key=jax.random.key(0))
        assert sum(math.prod(a.shape) for a in jax.tree.leaves(abstract)) == c.n_params
        assert all(a.shape[0] == c.n_layers for a in jax.tree.leaves(abstract.blocks))
    assert cfg.has_sinks and not CASES["sliding_global"][0].has_sinks
    # attention_sinks is the default of kinds whose sinks is null
    assert [k.sinks for k in cfg.replace(attention_sinks=True).layer_kinds] == [True, True, True]
    off = cfg.replace(layer_pattern=(LayerKind("sliding", window=5, sinks=False), LayerKind()), attention_sinks=True)
    assert [k.sinks for k in off.layer_kinds] == [False, True, False]
    assert lm.decay_mask(lm.init_model(cfg, key=jax.random.key(0))).blocks.attn.sinks is False


def test_per_kind_rope():
    cfg, _ = CASES["sinks_on_sliding"]
    sliding, glob = cfg.layer_pattern
    assert sliding.rope_config(cfg.rope) == cfg.rope
    rc = glob.rope_config(cfg.rope)
    assert (rc.theta, rc.scaling_type, rc.factor, rc.original_max_len) == (500.0, "yarn", 4.0, 16)
    assert LayerKind(rope=False).rope_config(cfg.rope) is None
    # a factor alone means llama3 scaling, as for the model
    assert LayerKind(rope_scaling_factor=8.0).rope_config(cfg.rope).scaling_type == "llama3"


@pytest.mark.parametrize(
    "pattern, words",
    [
        ([{"kind": "sliding"}], ["[0]", "sliding needs window", "window=None", "{kind: sliding, window: 1024}"]),
        ([{"kind": "global"}, {"kind": "chunked", "chunk": 0}], ["[1]", "chunked needs chunk", "chunk=0"]),
        ([{"kind": "global", "window": 8}], ["global has no window", "window=8", "remove window"]),
        ([{"kind": "sliding", "window": 8, "chunk": 4}], ["sliding has no chunk", "chunk=4"]),
        ([{"kind": "local"}], ["'local' is unknown", "global, sliding, chunked"]),
        ([{"kind": "global", "windw": 8}], ["[0].windw", "did you mean window"]),
        ([{"kind": "global", "repeat": 0}], ["[0].repeat=0", "positive"]),
        ([{"kind": "global", "rope": False, "rope_theta": 1e4}], ["rope: false", "rope_theta", "rope: true"]),
        ([{"kind": "global", "rope_scaling_type": "yarn"}], ["[0]", "yarn", "factor"]),
        ([{"kind": "global", "rope_scaling_factor": 0.5}], ["rope_scaling_factor=0.5", ">= 1"]),
        ([{"kind": "global", "sinks": "yes"}], ["sinks must be true, false or null", "'yes'"]),
        ([], ["layer_pattern=[]", "null"]),
        ("global", ["must be a list"]),
    ],
)
def test_pattern_errors(pattern, words):
    with pytest.raises(ValueError) as e:
        hybrid(layer_pattern=pattern)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_pattern_with_sliding_window_is_refused():
    with pytest.raises(ValueError, match="put the window in the pattern .{kind: sliding, window: 64}"):
        hybrid(sliding_window=64, layer_pattern=[{"kind": "global"}])


def test_yaml_and_code_forms():
    """The YAML form (from_dict) and the code form are one config; Hydra's: test_config_schema."""
    yaml = [{"kind": "sliding", "window": 512, "repeat": 2}, {"kind": "global"}]
    code = BASE.replace(layer_pattern=(LayerKind("sliding", window=512),) * 2 + (LayerKind(),))
    assert hybrid(layer_pattern=yaml) == code
    assert code.to_dict()["layer_pattern"] == yaml
    assert lm.ModelConfig.from_dict(code.to_dict()) == code and hash(code) == hash(hybrid(layer_pattern=yaml))
